"""What the TensorBoard posterior board costs: its seconds per epoch against the main job's epoch.

The main job's recipe (``digits-bbb-mlp``: a Bayes-by-Backprop MLP 64-64 on the offline digits,
batch 32, a 15% validation hold-out) trained for ``--epochs`` epochs with
``tfbnn.callbacks.PosteriorBoard`` at its defaults (scalars every epoch; histograms and the
validation predictive with T = 20 every tenth epoch; all of them and the reliability diagram at
the last epoch). The
board's own time is measured inside its ``on_epoch_end``; the epoch's is the training time
``tfbnn.callbacks.EpochTimer`` logs (``seconds``, without the board). The share is the board's
mean time per epoch (the heavier epochs amortized) over the median epoch, both after the first
epoch (which traces).

Usage:
    python benchmarks/posterior_board.py [--epochs 60] [--write-readme]

Writes ``benchmarks/results/posterior_board.json``.
"""

import argparse
import os
import statistics
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import tfbnn  # noqa: E402
from tfbnn import training  # noqa: E402
from tfbnn.training.run import arrays  # noqa: E402

import _readme  # noqa: E402
from _results import default_path, finish  # noqa: E402


class TimedBoard(tfbnn.callbacks.PosteriorBoard):
    """The board, timing its own epoch-end work."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.seconds = []

    def on_epoch_end(self, epoch, logs=None):
        start = time.perf_counter()
        super().on_epoch_end(epoch, logs)
        self.seconds.append(time.perf_counter() - start)


def _kinds(board, epochs):
    """The board's median seconds on its three kinds of epoch (after the first)."""
    kinds = {"scalars": [], "predictive": [], "image": []}
    for epoch, seconds in enumerate(board.seconds[1:], 1):
        last = epoch == epochs - 1
        if last or (board.reliability_every and epoch % board.reliability_every == 0):
            kinds["image"].append(seconds)
        elif epoch % board.validation_every == 0:
            kinds["predictive"].append(seconds)
        else:
            kinds["scalars"].append(seconds)
    return " / ".join(f"{statistics.median(v):.3f}" if v else "-" for v in kinds.values())


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=60)
    parser.add_argument("--output", default=default_path("posterior_board.json"))
    _readme.add_flag(parser)
    args = parser.parse_args()
    recipe = training.get_recipe("digits-bbb-mlp").replace(epochs=args.epochs)
    data = training.load_data(recipe)
    board = TimedBoard(tempfile.mkdtemp(), validation_data=arrays(data.validation), num_samples=20)
    result = training.run(recipe, output_dir=os.path.join(tempfile.mkdtemp(), "run"), verbose=0, jit_compile=False,
                          callbacks=[board], data=data, figures=False, quiet=True)
    epoch = statistics.median(row["seconds"] for row in result.history[1:])
    own = statistics.mean(board.seconds[1:])
    table = ("| main job epoch (s, median) | board per epoch (s, mean) | share | board: scalars only / with "
             "histograms and the predictive / with the image too (s, median) |\n|---|---|---|---|\n"
             f"| {epoch:.3f} | {own:.4f} | {100 * own / epoch:.1f}% | {_kinds(board, args.epochs)} |\n")
    finish("posterior_board", table, args.output,
           {"epochs": args.epochs, "epoch_seconds": [row["seconds"] for row in result.history],
            "board_seconds": board.seconds, "num_validation": int(data.num_validation)}, args.write_readme)


if __name__ == "__main__":
    main()
