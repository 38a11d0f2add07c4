"""Where the benchmark scripts keep their numbers: ``benchmarks/results/`` (git-ignored), as JSON."""

import json
import os
import time

import _readme

RESULTS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def default_path(filename):
    """``benchmarks/results/<filename>``, the default of each script's output option."""
    return os.path.join(RESULTS_DIR, filename)


def write_json(path, payload):
    """Writes ``payload`` to ``path`` (creating its folder) and says where."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(payload, f, indent=1)
    print(f"wrote {path}")


def finish(name, table, path, payload, write_readme):
    """How a benchmark ends: prints ``table``, writes ``payload`` and the table as JSON to ``path``
    and, with ``--write-readme``, the table into ``benchmarks/README.md`` between ``name``'s markers."""
    print(table)
    write_json(path, {**payload, "table": table})
    if write_readme:
        _readme.write_table(name, table)


#: The kernel-library paths a CPU benchmark runs once each, and how their rows are labelled.
KERNEL_PATHS = {"eigen": "Eigen (TF_ENABLE_ONEDNN_OPTS=0)", "onednn": "oneDNN (TF_ENABLE_ONEDNN_OPTS=1)"}


def kernel_path():
    """This process's kernel path (a key of :data:`KERNEL_PATHS`), from ``TF_ENABLE_ONEDNN_OPTS``."""
    return "eigen" if os.environ.get("TF_ENABLE_ONEDNN_OPTS") == "0" else "onednn"


def save_path_rows(name, rows, **payload):
    """Writes this kernel path's ``rows`` to ``results/<name>_<path>.json``; returns the rows of both
    paths, this run's and the other path's last ones (none where it never ran)."""
    write_json(default_path(f"{name}_{kernel_path()}.json"), {"rows": rows, **payload})
    both = []
    for path in KERNEL_PATHS:
        try:
            with open(default_path(f"{name}_{path}.json"), encoding="utf-8") as f:
                both += json.load(f)["rows"]
        except FileNotFoundError:
            pass
    return both


def interleaved_ms(steps, rounds, calls):
    """``{name: [ms per call of each round]}``: ``rounds`` rounds, each calling every step ``calls`` times in turn.

    Interleaving lets the slow stretches of a shared machine hit every step alike.
    """
    times = {name: [] for name in steps}
    for _ in range(rounds):
        for name, step in steps.items():
            start = time.perf_counter()
            for _ in range(calls):
                step()
            times[name].append(1000 * (time.perf_counter() - start) / calls)
    return times
