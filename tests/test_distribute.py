"""tfbnn.distribute: strategy choice, and BNN training under MirroredStrategy / MultiWorkerMirroredStrategy.

TensorFlow fixes its devices once per process, so the checks on 2 logical CPUs run
in subprocesses (tests/_distribute_worker.py); this process only checks the parts
that need no second device.
"""

import argparse
import contextlib
import json
import os
import socket
import subprocess
import sys
import time
import types

import numpy as np
import pytest
import tensorflow as tf

from tfbnn import distribute

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_distribute_worker.py")
TIMEOUT_S = 240  # a hung collective must fail the test, not the session


def _env(**extra):
    env = {k: v for k, v in os.environ.items() if k.lower() not in ("http_proxy", "https_proxy", "grpc_proxy")}
    env.update({"TF_CPP_MIN_LOG_LEVEL": "3", "CUDA_VISIBLE_DEVICES": "", "NO_PROXY": "127.0.0.1,localhost",
                "no_proxy": "127.0.0.1,localhost"})
    env.pop("TF_CONFIG", None)
    env.update(extra)
    return env


@contextlib.contextmanager
def _processes(commands, envs, log_dir):
    """Starts one process per command; kills whatever is still running on exit."""
    procs = []
    try:
        for i, (command, env) in enumerate(zip(commands, envs)):
            log = open(os.path.join(log_dir, f"process{i}.log"), "w")
            procs.append((subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT), log))
        yield [p for p, _ in procs]
    finally:
        for p, log in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
            log.close()


def _wait(procs, log_dir):
    deadline = time.monotonic() + TIMEOUT_S
    for p in procs:
        try:
            p.wait(timeout=max(deadline - time.monotonic(), 1))
        except subprocess.TimeoutExpired:
            pytest.fail(f"distributed subprocess timed out after {TIMEOUT_S} s:\n{_logs(log_dir)}")
    failed = [p.returncode for p in procs if p.returncode != 0]
    if failed:
        pytest.fail(f"distributed subprocesses failed with {failed}:\n{_logs(log_dir)}")


def _logs(log_dir):
    text = []
    for name in sorted(os.listdir(log_dir)):
        if name.endswith(".log"):
            with open(os.path.join(log_dir, name)) as f:
                text.append(f"--- {name}\n" + f.read()[-3000:])
    return "\n".join(text)


# -- in process ----------------------------------------------------------------------


def _cluster(n, index=0):
    workers = [f"127.0.0.1:{2000 + i}" for i in range(n)]
    return {"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}}


def test_resolve_strategy_name():
    assert distribute.resolve_strategy_name("auto", tf_config=json.dumps(_cluster(2)), num_gpus=0) == "multi_worker"
    assert distribute.resolve_strategy_name("auto", tf_config=_cluster(1), num_gpus=0) == "default"
    assert distribute.resolve_strategy_name("auto", tf_config="", num_gpus=2) == "mirrored"
    assert distribute.resolve_strategy_name("auto", tf_config="", num_gpus=1) == "default"
    chief = {"cluster": {"chief": ["a:1"], "worker": ["b:1"]}, "task": {"type": "chief", "index": 0}}
    assert distribute.resolve_strategy_name("auto", tf_config=chief, num_gpus=0) == "multi_worker"
    for name in ("default", "mirrored", "multi_worker"):
        assert distribute.resolve_strategy_name(name, tf_config=_cluster(2), num_gpus=4) == name


def test_get_strategy_default_and_errors(monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    default = distribute.get_strategy("default")
    assert default is tf.distribute.get_strategy() and distribute.num_replicas(default) == 1
    if not tf.config.list_physical_devices("GPU"):
        assert distribute.get_strategy("auto") is default
    with pytest.raises(ValueError, match=r"Unknown strategy.*Received: strategy='tpu'"):
        distribute.get_strategy("tpu")
    with pytest.raises(ValueError, match=r"Received: devices=\['/cpu:0'\] with strategy='default'"):
        distribute.get_strategy("default", devices=["/cpu:0"])
    with pytest.raises(ValueError, match="Received: devices=\\[\\]"):
        distribute.get_strategy("mirrored", devices=[])
    monkeypatch.setenv("TF_CONFIG", "{not json")
    with pytest.raises(ValueError, match="TF_CONFIG is not valid JSON"):
        distribute.get_strategy("auto")


def test_split_cpu_after_initialisation():
    tf.constant(0.0)  # devices are fixed from here on
    current = len(tf.config.list_logical_devices("CPU"))
    assert len(distribute.split_cpu(current)) == current  # asking for what is there is fine
    with pytest.raises(RuntimeError, match="before any TensorFlow op"):
        distribute.split_cpu(current + 1)
    with pytest.raises(ValueError, match="Received: num_devices=0"):
        distribute.split_cpu(0)


def test_jit_compile_for_and_is_chief():
    default = tf.distribute.get_strategy()
    assert distribute.jit_compile_for(default, True) is True and distribute.jit_compile_for(default, "auto") == "auto"
    two = types.SimpleNamespace(num_replicas_in_sync=2)
    assert distribute.jit_compile_for(two, "auto") is False
    with pytest.warns(UserWarning, match="jit_compile=True is turned off"):
        assert distribute.jit_compile_for(two, True) is False

    assert distribute.is_chief(tf_config="")
    assert distribute.is_chief(tf_config=_cluster(2, index=0))
    assert not distribute.is_chief(tf_config=_cluster(2, index=1))
    with_chief = {"cluster": {"chief": ["a:1"], "worker": ["b:1"]}, "task": {"type": "worker", "index": 0}}
    assert not distribute.is_chief(tf_config=with_chief)
    assert distribute.is_chief(default, tf_config=_cluster(2, index=1))  # not a multi-worker strategy


def test_command_line_options(monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    parser = argparse.ArgumentParser()
    distribute.add_strategy_argument(parser)
    args = parser.parse_args([])
    assert args.strategy == "auto" and args.cpu_devices is None
    if not tf.config.list_physical_devices("GPU"):
        assert distribute.strategy_from_args(args) is tf.distribute.get_strategy()
    assert parser.parse_args(["--strategy", "mirrored"]).strategy == "mirrored"
    for bad in (["--strategy", "tpu"], ["--cpu-devices", "0"]):
        with pytest.raises(SystemExit):
            parser.parse_args(bad)
    tf.constant(0.0)
    taken = len(tf.config.list_logical_devices("CPU"))
    if not tf.config.list_physical_devices("GPU"):
        with pytest.raises(ValueError, match="Cannot split the CPU"):
            distribute.strategy_from_args(parser.parse_args(["--cpu-devices", str(taken + 1)]))


# -- MirroredStrategy on 2 logical CPUs (one subprocess for all checks) ---------------------


@pytest.fixture(scope="module")
def mirrored(tmp_path_factory):
    folder = tmp_path_factory.mktemp("mirrored")
    out = folder / "result.json"
    with _processes([[sys.executable, WORKER, "mirrored", str(out)]], [_env()], str(folder)) as procs:
        _wait(procs, str(folder))
    with open(out) as f:
        return json.load(f)


@pytest.mark.heavy
def test_mirrored_runs_on_two_logical_cpus(mirrored):
    assert mirrored["devices"] == ["/device:CPU:0", "/device:CPU:1"]
    assert mirrored["num_replicas"] == 2
    assert mirrored["auto"] == "default"  # logical CPUs are for tests; auto mirrors GPUs only
    assert mirrored["jit_compile"] is False


@pytest.mark.heavy
def test_mirrored_step_matches_single_device_with_noise_fixed(mirrored):
    step = mirrored["one_step"]
    # The KL is most of the loss: counted twice or halved, the losses would differ by ~10.
    assert step["kl_over_n"] > 0.5 * step["loss_single"]
    assert step["kl_weights"] == pytest.approx([0.01] * 3)
    assert step["loss_mirrored"] == pytest.approx(step["loss_single"], rel=1e-6, abs=1e-5)
    assert step["max_update"] > 1e-2  # the step did move the weights
    assert step["max_update_diff"] < 2e-6 and step["max_weight_diff"] < 2e-6
    # The multi-worker loop of tfbnn.distribute.fit makes the same step (run here on 2 local replicas).
    assert step["loss_loop"] == pytest.approx(step["loss_single"], rel=1e-6, abs=1e-5)
    assert step["max_weight_diff_loop"] < 2e-6


@pytest.mark.heavy
@pytest.mark.parametrize(
    "layer", ["DenseReparameterization", "DenseFlipout", "DenseLocalReparameterization", "MCDropout"]
)
def test_replicas_draw_distinct_noise(mirrored, layer):
    r = mirrored["replica_noise"][layer]
    assert r["replica_diff"] > 1e-2  # identical inputs, distinct noise per replica
    assert r["step_diff"] > 1e-2  # fresh noise at every call
    assert r["replica0_vs_single"] == 0.0  # replica 0 draws what one device draws with this seed
    first, second = r["seed_states"]
    assert first == second and first[0] == 7 and first[1] > 0  # the mirrored seed state stays in sync


# -- MultiWorkerMirroredStrategy: 2 workers on 127.0.0.1 ----------------------------------------


def _free_ports(n):
    sockets = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


@pytest.mark.heavy
def test_multi_worker_training_agrees(tmp_path):
    workers = [f"127.0.0.1:{port}" for port in _free_ports(2)]
    envs = [_env(TF_CONFIG=json.dumps({"cluster": {"worker": workers}, "task": {"type": "worker", "index": i}}))
            for i in range(2)]
    command = [sys.executable, WORKER, "worker", str(tmp_path)]
    with _processes([command, command], envs, str(tmp_path)) as procs:
        _wait(procs, str(tmp_path))
    results = [np.load(tmp_path / f"worker{i}.npz") for i in range(2)]
    weights = [[r[f"arr_{k}"] for k in range(len(r.files) - 3)] for r in results]
    assert len(weights[0]) == len(weights[1]) > 0
    for a, b in zip(*weights):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)
    for r in results:
        assert r["loss"].shape == (2,) and np.all(np.isfinite(r["loss"]))
        assert float(r["moved"]) > 1e-3  # it trained
    np.testing.assert_allclose(results[0]["loss"], results[1]["loss"], rtol=1e-6)
    assert bool(results[0]["chief"]) and not bool(results[1]["chief"])


def test_fit_delegates_to_keras_fit_outside_multi_worker():
    import keras

    import tfbnn

    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(40, 3)).astype("float32"), rng.integers(0, 2, size=40)
    model = keras.Sequential([keras.Input((3,)), tfbnn.layers.DenseLocalReparameterization(2, activation="softmax",
                                                                                           seed=1)])
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    history = distribute.fit(model, x, y, batch_size=16, epochs=2,
                             callbacks=[tfbnn.KLAnnealing(num_examples=40, schedule="constant")])
    assert len(history.history["loss"]) == 2 and np.all(np.isfinite(history.history["loss"]))
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(16)
    assert len(distribute.fit(model, dataset, epochs=1).history["loss"]) == 1
