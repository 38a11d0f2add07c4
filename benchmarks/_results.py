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
