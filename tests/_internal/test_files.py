"""tfbnn._internal.files (the package's own plumbing): atomic writes, and the temporary files a killed run leaves behind."""

import json
import os
import subprocess
import sys
from unittest import mock

import keras
import numpy as np
import pytest

from tfbnn._internal import files
from tfbnn._internal.errors import RunError


def _dead_pid():
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def test_a_temporary_file_of_a_killed_save_is_removed_by_the_next_save(tmp_path):
    """Issue 12 item 8: a run killed while saving left `.model.keras.<...>` beside the target for good."""
    target = tmp_path / "model.keras"
    stale = tmp_path / f".model.keras{files.TMP_MARKER}.{_dead_pid()}.deadbeef.keras"
    stale.write_bytes(b"half a zip")
    alive = tmp_path / f".model.keras{files.TMP_MARKER}.1.cafebabe.keras"  # pid 1 runs: another save in progress
    alive.write_bytes(b"someone else's save")
    other = tmp_path / f".other.keras{files.TMP_MARKER}.{_dead_pid()}.0.keras"  # another target: not ours to clean
    other.write_bytes(b"x")
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    files.save_model(model, str(target))
    assert sorted(os.listdir(tmp_path)) == sorted([alive.name, other.name, "model.keras"])
    assert keras.saving.load_model(target).count_params() == 3


def test_a_killed_save_in_a_real_process_is_cleaned_up(tmp_path):
    target = tmp_path / "m.json"
    code = (f"import os; from tfbnn._internal import files\n"
            f"with files.atomic_write({str(target)!r}) as tmp:\n"
            f"    open(tmp, 'w').write('partial')\n"
            f"    os._exit(9)\n")  # killed mid-write: the temporary stays, the target never appears
    assert subprocess.run([sys.executable, "-c", code], timeout=120).returncode == 9
    leftovers = [n for n in os.listdir(tmp_path) if files.TMP_MARKER in n]
    assert len(leftovers) == 1 and not target.exists()
    files.write_json(str(target), {"a": 1})
    assert os.listdir(tmp_path) == ["m.json"] and json.loads(target.read_text()) == {"a": 1}


def test_a_failing_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path):
    target = tmp_path / "r.json"
    files.write_json(str(target), {"old": True})
    with pytest.raises(ZeroDivisionError):
        with files.atomic_write(str(target)) as tmp:
            open(tmp, "w").write("new")
            1 / 0
    assert json.loads(target.read_text()) == {"old": True} and os.listdir(tmp_path) == ["r.json"]


def test_save_model_failure_is_a_run_error_naming_the_kept_file(tmp_path):
    target = tmp_path / "m.keras"
    target.write_bytes(b"previous")
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])

    def failing(self, path, *a, **k):
        open(path, "wb").write(b"partial")
        raise OSError("disk full")

    with mock.patch.object(keras.Model, "save", failing), \
            pytest.raises(RunError, match="disk full; .*m.keras was left untouched"):
        files.save_model(model, str(target))
    assert target.read_bytes() == b"previous" and os.listdir(tmp_path) == ["m.keras"]


def test_records_and_tables(tmp_path):
    path = files.write_csv(str(tmp_path / "t.csv"), [{"a": np.float32(0.5), "b": None}, {"c": np.int64(3)}],
                        columns=["c"])
    assert open(path).read().splitlines() == ["c,a,b", ",0.5,", "3,,"]
    files.write_json(str(tmp_path / "t.json"), {"x": np.float64(float("nan")), "y": np.arange(2)})
    assert json.loads((tmp_path / "t.json").read_text()) == {"x": "nan", "y": [0, 1]}
    table = files.format_table("T", [[("a", 1), ("bbb", 22)], [("c", "x", "yy")]]).splitlines()
    assert table == ["T", "-", "a     1", "bbb  22", "", "c    x  yy"]
    with pytest.raises(ValueError, match="Received: --out="):
        files.prepare_output_dir(str(tmp_path / "t.json" / "sub"), "--out")


def test_markdown_table_rows_escaping_and_errors():
    text = files.markdown_table(["a", "b"], [[1, "x|y"], [2.5, None]])
    assert text.splitlines() == ["| a | b |", "|---|---|", "| 1 | x\\|y |", "| 2.5 | None |"]
    assert text.endswith("\n")
    assert files.markdown_table(["only"], []) == "| only |\n|---|\n"
    with pytest.raises(ValueError, match=r"Expected rows of 2 cells .*rows\[1\]=\[3\]"):
        files.markdown_table(["a", "b"], [[1, 2], [3]])
    with pytest.raises(ValueError, match="header=\\[\\]"):
        files.markdown_table([], [])


def test_staging_folders_of_dead_processes_are_removed_by_the_next_run(tmp_path):
    """Issue 28: a killed `tfbnn train` left `.<name>.tfbnn-tmp.<pid>` folders behind for good."""
    out = tmp_path / "run"
    stale = tmp_path / f".run{files.TMP_MARKER}.{_dead_pid()}"
    (stale / "sub").mkdir(parents=True)
    (stale / "sub" / "history.csv").write_text("epoch\n")
    alive = tmp_path / f".run{files.TMP_MARKER}.1"  # pid 1 runs: another run staging into the same folder
    alive.mkdir()
    stage = files.make_staging_folder(str(out))
    assert sorted(os.listdir(tmp_path)) == sorted([alive.name, os.path.basename(stage)])
    assert os.path.basename(stage) == f".run{files.TMP_MARKER}.{os.getpid()}" and os.listdir(stage) == []
    files.remove_staging_folder(stage)
    assert os.listdir(tmp_path) == [alive.name]


def test_sigterm_removes_the_staging_folder_and_still_ends_the_process(tmp_path):
    import signal

    out = tmp_path / "run"
    # `_tfbnn_command` first: the package then imports without TensorFlow (a fast child).
    code = ("import sys, time, _tfbnn_command\nfrom tfbnn._internal import files\n"
            f"stage = files.make_staging_folder({str(out)!r})\n"
            "open(stage + '/results.json', 'w').write('{}')\n"
            "print('staged', flush=True)\ntime.sleep(60)\n")
    process = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                               cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert process.stdout.readline().strip() == "staged"
    assert len(os.listdir(tmp_path)) == 1
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=30) == -signal.SIGTERM  # killed by the signal, as without the handler
    assert os.listdir(tmp_path) == []
