"""Distributed KerasTuner on one machine: a chief and workers over gRPC on 127.0.0.1.

KerasTuner's own chief/worker mode: every process runs the same search with
``KERASTUNER_TUNER_ID`` (``chief``, ``tuner0``, ``tuner1``, ...),
``KERASTUNER_ORACLE_IP`` and ``KERASTUNER_ORACLE_PORT`` set; the chief serves the
oracle, the workers train. :func:`launch_distributed` starts such a group,
:func:`wait_for_chief` lets a worker wait for the chief's port, :func:`tuner_id`
names this process.
"""

import os
import socket
import subprocess
import time

from tfbnn.tuning.spaces import is_positive_int

__all__ = ["tuner_id", "free_port", "wait_for_chief", "launch_distributed"]


def tuner_id():
    """This process's ``KERASTUNER_TUNER_ID`` (``"tuner0"`` when not distributed)."""
    return os.environ.get("KERASTUNER_TUNER_ID", "tuner0")


def free_port(host="127.0.0.1"):
    """A TCP port on ``host`` that is free right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _port_open(host, port):
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def wait_for_chief(timeout=600.0, poll=0.2):
    """In a distributed worker: blocks until the chief's gRPC port accepts connections.

    A worker that builds its tuner only after this never races the chief's
    ``overwrite`` of the project folder. Raises RuntimeError after ``timeout`` seconds.
    """
    host, port = os.environ["KERASTUNER_ORACLE_IP"], int(os.environ["KERASTUNER_ORACLE_PORT"])
    deadline = time.monotonic() + timeout
    while not _port_open(host, port):
        if time.monotonic() > deadline:
            raise RuntimeError(f"No KerasTuner chief answered on {host}:{port} within {timeout:g} s.")
        time.sleep(poll)


def _wait_or_kill(process, timeout):
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def _stop(processes):
    for process in processes:
        if process.poll() is None:
            process.terminate()
    for process in processes:
        _wait_or_kill(process, 10)


def launch_distributed(command, num_workers, host="127.0.0.1", port=None, log_dir=None, env=None,
                       chief_stdout=None, start_timeout=300.0, workers_wait_for_chief=False):
    """Runs ``command`` as a KerasTuner chief and ``num_workers`` workers on this machine.

    The chief (``KERASTUNER_TUNER_ID=chief``) starts first; the workers
    (``tuner0``, ``tuner1``, ...) start once its gRPC port accepts connections (so that
    they never see a project folder the chief is about to overwrite), or right away with
    ``workers_wait_for_chief=True`` for commands whose workers wait for the port
    themselves before touching the folder (``tfbnn tune`` does; it saves their start-up
    time). All get
    ``KERASTUNER_ORACLE_IP=host`` and ``KERASTUNER_ORACLE_PORT=port``. The command must
    build the same tuner in every process and call ``search`` (the chief's blocks
    until every trial has ended) -- ``tfbnn tune`` and the scripts in ``tuners/`` do.

    Args:
        command: list of str, the program and its arguments (e.g.
            ``[sys.executable, "-m", "tfbnn.tuning_cli", "tune", ...]``).
        num_workers: int >= 1.
        host: the chief's address. Default 127.0.0.1.
        port: int or None (a free port).
        log_dir: folder for the workers' output (``worker-tuner0.log``, ...); default:
            their output is discarded.
        env: dict or None, the base environment (default ``os.environ``).
        chief_stdout: a file object for the chief's output (default: this process's).
        start_timeout: seconds to wait for the chief's port.

    Returns:
        The chief's exit status (0 when it and every worker succeeded; a failed
        worker makes it 1 at least and stops the rest, so the chief never waits forever).
    """
    if not is_positive_int(num_workers):
        raise ValueError(f"Expected `num_workers` to be a positive integer. Received: num_workers={num_workers!r}")
    port = free_port(host) if port is None else int(port)
    base = dict(os.environ if env is None else env)
    base.update({"KERASTUNER_ORACLE_IP": host, "KERASTUNER_ORACLE_PORT": str(port)})

    def start(process_id, stdout):
        return subprocess.Popen(list(command), env={**base, "KERASTUNER_TUNER_ID": process_id},
                                stdout=stdout, stderr=subprocess.STDOUT if stdout is not None else None)

    chief = start("chief", chief_stdout)
    processes, logs = [chief], []
    try:
        deadline = time.monotonic() + start_timeout
        while not workers_wait_for_chief and not _port_open(host, port):
            if chief.poll() is not None:
                return chief.returncode or 1
            if time.monotonic() > deadline:
                raise RuntimeError(f"The KerasTuner chief did not open {host}:{port} within {start_timeout:g} s.")
            time.sleep(0.2)
        for k in range(num_workers):
            worker_id = f"tuner{k}"
            if log_dir is not None:
                os.makedirs(log_dir, exist_ok=True)
                logs.append(open(os.path.join(log_dir, f"worker-{worker_id}.log"), "w"))
                stdout = logs[-1]
            else:
                stdout = subprocess.DEVNULL
            processes.append(start(worker_id, stdout))
        workers = processes[1:]
        failed = False
        while chief.poll() is None:
            if any(w.poll() not in (None, 0) for w in workers):
                failed = True  # the chief would wait for the lost worker's trial forever
                break
            time.sleep(0.5)
        if failed:
            _stop(processes)
            return 1
        for w in workers:
            _wait_or_kill(w, 60)
        if chief.returncode != 0:
            return chief.returncode
        return 0 if all(w.returncode == 0 for w in workers) else 1
    finally:
        _stop(processes)
        for f in logs:
            f.close()
