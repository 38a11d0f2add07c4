"""The scale-mixture prior grid of Blundell et al. (2015), sec. 5.1, with the tfbnn library API.

pi in {1/4, 1/2, 3/4} x -log sigma1 in {0, 1, 2} x -log sigma2 in {6, 7, 8}: a
KerasTuner GridSearch of 27 trials, each a Bayes-by-Backprop MLP trained for a
fixed number of epochs and scored on a validation split (the paper names no best
point; the library's default, pi = 1/4, sigma1 = 1, sigma2 = e^-8 = 3.35e-4, won the
seed study's rerun).

    python tuners/blundell_prior_grid.py --dataset digits --epochs 5
    python tuners/blundell_prior_grid.py --dataset digits --epochs 5      # again: resumes, re-runs nothing
    python tuners/blundell_prior_grid.py --dataset digits --epochs 5 --overwrite

Distributed (KerasTuner's chief/worker mode over gRPC): run it under
``tuners/launch_distributed.py`` or with the KERASTUNER_* variables set on each
machine (see tuners/README.md); the chief prints the results, workers only train.

The same search with more options (custom grids, extra dimensions, --workers):
``tfbnn tune --search blundell-prior-grid``.
"""

import argparse
import os

import tfbnn
from tfbnn import tuning


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", default="digits", choices=tfbnn.datasets.DATASETS)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--hidden-units", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--objective", default="val_accuracy", choices=list(tuning.OBJECTIVES))
    parser.add_argument("--run-eagerly", action="store_true", help="faster for trials of a few steps")
    parser.add_argument("--output", default=os.path.join("tuners", "results", "blundell_prior_grid"))
    parser.add_argument("--overwrite", action="store_true", help="start over (only the chief may, when distributed)")
    args = parser.parse_args()

    ds = tfbnn.datasets.load(args.dataset)
    space = tuning.BlundellPriorSpace()  # the paper's 27 combinations
    hypermodel = tuning.BayesianMLPHyperModel(
        ds.input_shape, ds.num_classes, space=space, hidden_units=args.hidden_units, depth=2,
        layer="flipout", batch_size=args.batch_size, validation_split=1 / 6, run_eagerly=args.run_eagerly,
        fit_log=os.path.join(args.output, "fits.jsonl"),
    )
    os.makedirs(args.output, exist_ok=True)
    tuner = tuning.GridSearch(hypermodel, objective=args.objective, directory=args.output,
                              project_name="search", overwrite=args.overwrite)
    role = tuning.distributed_role()
    if role != "worker":
        tuner.oracle.verbose = 1
    tuner.search(ds.x_train, ds.y_train, epochs=args.epochs)  # the chief's blocks until every trial ended
    if role == "worker":
        return

    records = tuning.trial_records(tuner)
    tuning.write_csv(records, os.path.join(args.output, "results.csv"))
    tuning.plot_prior_grid(records, os.path.join(args.output, "heatmap.png"), metric=args.objective)
    print(f"\n{'pi':>5} {'sigma1':>8} {'sigma2':>9} {'val_accuracy':>13}")
    for r in records[:5]:
        print(f"{r['pi']:5g} {r['sigma1']:8.3g} {r['sigma2']:9.3g} {r['val_accuracy']:13.4f}")
    print(f"\nresults: {args.output}/results.csv, {args.output}/heatmap.png")


if __name__ == "__main__":
    main()
