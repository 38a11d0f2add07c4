"""The notebooks in notebooks/: committed executed, and every one runs top to bottom.

Two checks per notebook:

* the committed file was executed in full (offline, not in quick mode), top to bottom
  in one kernel, without an error output, and stays small;
* it runs again here in quick mode (``TFBNN_NOTEBOOK_QUICK=1``: fewer epochs, widths
  and samples) in a fresh kernel whose working directory is a temporary folder, so its
  outputs land there. A cell that raises fails the test. Heavy; one test per notebook,
  so pytest-xdist spreads them.

The same :func:`execute` produces the committed outputs (the full offline run, in
``notebooks/``)::

    python tests/test_notebooks.py notebooks/01_bayes_by_backprop.ipynb [...]
"""

import os
import pathlib
import sys
import time

import nbformat
import pytest
from nbclient import NotebookClient

ROOT = pathlib.Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
CELL_TIMEOUT = 600  # seconds per cell in quick mode (the tests)
#: ... and in a full run (main): a study cell runs HMC references for minutes
FULL_CELL_TIMEOUT = 3600
MAX_BYTES = 1_500_000


def execute(path, quick, cwd):
    """Runs the notebook at ``path`` in a fresh python3 kernel with working directory ``cwd``.

    ``quick`` sets ``TFBNN_NOTEBOOK_QUICK=1``. The kernel imports tfbnn from this checkout
    (``PYTHONPATH``). TensorFlow's C++ start-up lines go to the kernel's stderr, not into the
    notebook. Returns the executed notebook; raises ``nbclient.exceptions.CellExecutionError``
    when a cell fails.
    """
    nb = nbformat.read(str(path), as_version=4)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    env.pop("TFBNN_NOTEBOOK_QUICK", None)
    if quick:
        env["TFBNN_NOTEBOOK_QUICK"] = "1"
    client = NotebookClient(nb, timeout=CELL_TIMEOUT if quick else FULL_CELL_TIMEOUT, kernel_name="python3",
                            resources={"metadata": {"path": str(cwd)}},
                            extra_arguments=["--IPKernelApp.capture_fd_output=False"])
    client.execute(env=env)
    return nb


def _code_cells(nb):
    return [cell for cell in nb.cells if cell.cell_type == "code"]


def _text(cell):
    return "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream")


def _errors(nb):
    return [(cell.execution_count, o.get("ename"), o.get("evalue"))
            for cell in _code_cells(nb) for o in cell.outputs if o.output_type == "error"]


def _ids(paths):
    return [p.stem for p in paths]


def test_there_is_a_notebook_per_study():
    assert [p.stem.split("_", 1)[1] for p in NOTEBOOKS] == [
        "bayes_by_backprop", "variational_dropout", "ibnn", "cifar_comparison", "uncertainty_in_production",
        "posterior_comparison", "shift_benchmark", "kerashub_finetune"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_committed_notebook_is_executed_in_full(path):
    nb = nbformat.read(str(path), as_version=4)
    cells = _code_cells(nb)
    assert [cell.execution_count for cell in cells] == list(range(1, len(cells) + 1)), \
        "run it top to bottom in one kernel (python tests/test_notebooks.py <notebook>)"
    assert not _errors(nb)
    first = cells[0].source
    assert 'DATASET = "' in first and 'QUICK = os.environ.get("TFBNN_NOTEBOOK_QUICK") == "1"' in first
    text = "".join(_text(cell) for cell in cells)
    assert ("full run on digits" in text or path.stem == "06_posterior_comparison") and "full run on " in text \
        and "quick run on" not in text, \
        "the committed outputs must come from the full offline run, not quick mode"
    assert path.stat().st_size < MAX_BYTES


@pytest.mark.heavy
@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_notebook_runs_in_quick_mode(path, tmp_path):
    nb = execute(path, quick=True, cwd=tmp_path)
    assert not _errors(nb)
    assert "quick run on " in "".join(_text(cell) for cell in _code_cells(nb))
    assert (tmp_path / "outputs").is_dir(), "the notebook writes its files under outputs/ of its working directory"


def main(paths):
    """Executes each notebook in full (not quick) in ``notebooks/`` and saves it in place."""
    for name in paths:
        path = pathlib.Path(name).resolve()
        start = time.perf_counter()
        cpu = os.times()
        nb = execute(path, quick=False, cwd=path.parent)
        end = os.times()
        nbformat.write(nb, str(path))
        print(f"{path.name}: {time.perf_counter() - start:.0f} s wall, "
              f"{end.children_user + end.children_system - cpu.children_user - cpu.children_system:.0f} s CPU "
              "of the kernel", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
