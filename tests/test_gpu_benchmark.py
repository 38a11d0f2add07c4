"""benchmarks/gpu.py runs unchanged on a machine without a GPU: it says so; with --allow-cpu it runs its
groups (the same code a GPU machine runs) and its table's ratios are of the rows it measured."""

import json
import os
import sys

import keras
import pytest

BENCHMARKS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks")
sys.path.insert(0, BENCHMARKS)
import gpu  # noqa: E402

sys.path.pop(0)


def test_without_a_gpu_it_says_so_and_measures_nothing(tmp_path, capsys):
    out = tmp_path / "gpu.json"
    assert gpu.main(["--out", str(out)]) == 0
    assert capsys.readouterr().out.strip() == gpu.NO_GPU
    assert not out.exists()


@pytest.mark.parametrize("argv, needle", [(["--steps", "0"], "--steps must be at least 1. Received: 0"),
                                          (["--impl", "bogus"], "--impl takes"),
                                          (["--precision", "float64"], "invalid choice: 'float64'")])
def test_bad_options_are_named(argv, needle, capsys):
    with pytest.raises(SystemExit) as stop:
        gpu.main(argv)
    assert stop.value.code == 2 and needle in capsys.readouterr().err


@pytest.mark.heavy
def test_on_the_cpu_every_group_is_measured_and_each_ratio_is_of_its_own_group(tmp_path):
    out = tmp_path / "gpu.json"
    argv = ["--allow-cpu", "--networks", "lenet5", "--impl", "keras_conv", "tfbnn_flipout", "tf_keras_conv",
            "tfp_flipout", "--precision", "float32", "mixed_float16", "--steps", "1", "--rounds", "2", "--out", str(out)]
    assert gpu.main(argv) == 0
    assert keras.mixed_precision.global_policy().name == "float32"  # restored after the mixed group
    result = json.loads(out.read_text())
    rows = {(r["precision"], r["impl"]): r for r in result["rows"]}
    assert set(rows) == {(p, i) for p in ("float32", "mixed_float16") for i in ("keras_conv", "tfbnn_flipout",
                                                                               "tf_keras_conv", "tfp_flipout")}
    assert result["placements"] == ["cpu"]
    lines = result["table"].splitlines()
    for (precision, impl), row in rows.items():
        assert row["batch"] == 32 and row["replicas"] == 1
        line = next(l for l in lines if f"| {precision} | cpu | 32 | {impl} |" in l)
        if "error" in row:
            assert "failed:" in line
            continue
        assert len(row["rounds"]) == 2 and row["ms_per_step"] == min(row["rounds"])
        own = rows[(precision, "tf_keras_conv" if impl.startswith(("tfp_", "tf_keras_")) else "keras_conv")]
        assert f"| {row['ms_per_step'] / own['ms_per_step']:.2f} |" in line
    # tfbnn's layer trains under the mixed policy; its row has a ratio to TFP's when TFP's ran too
    assert "error" not in rows[("mixed_float16", "tfbnn_flipout")]
    tfp_row = rows[("float32", "tfp_flipout")]
    if "error" not in tfp_row:
        ratio = rows[("float32", "tfbnn_flipout")]["ms_per_step"] / tfp_row["ms_per_step"]
        assert f"| {ratio:.2f} |" in next(l for l in lines if "| float32 | cpu | 32 | tfbnn_flipout |" in l)
