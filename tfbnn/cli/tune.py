"""``tfbnn tune``: KerasTuner searches from the command line (see :mod:`tfbnn.tuning`).

Written as a ``tfbnn`` subcommand (``add_arguments`` / ``run``, the
pattern of :mod:`tfbnn.cli`); it also runs on its own::

    python -m tfbnn.cli.tune tune --search blundell-prior-grid --dataset digits --epochs 5

Output folder (``--output``, default ``tuners/results/<search>-<dataset>``)::

    search/          the KerasTuner project (oracle.json, trial_*/trial.json, checkpoints)
    results.csv      every trial, best first: hyperparameters, sigmas, score, metrics
    heatmap.png      best validation metric over (-log sigma1, -log sigma2), one panel per pi
    fits.jsonl       one line per fit begin / end: which process trained which values
    settings.json    the settings of the search in the folder (a resume must match them)
    worker-*.log     the workers' output (with --workers)
"""

import gc
import json
import math
import os
import re
import sys

from tfbnn import datasets
from tfbnn._internal import argtypes
from tfbnn._internal.errors import RunError as CommandError
from tfbnn._internal.files import format_table, prepare_output_dir, write_json
from tfbnn.cli import build_parser as command_parser
from tfbnn.datasets.catalog import ARRAY_DATASETS
from tfbnn.training.recipe import KL_SCHEDULES as SCHEDULE_NAMES

PROG = "tfbnn"

__all__ = ["DESCRIPTION", "EPILOG", "add_arguments", "run", "main", "TUNE_DEFAULTS"]

SEARCH_NAMES = ("blundell-prior-grid", "ibnn-random")  # = tfbnn.tuning.SEARCHES (kept light: no TF import)
OBJECTIVE_NAMES = ("val_accuracy", "val_nll", "val_loss")
LAYER_NAMES = ("flipout", "local_reparameterization", "reparameterization")
DATASET_NAMES = ARRAY_DATASETS

# Defaults: the bare command runs the 27-trial grid on the offline digits set.
TUNE_DEFAULTS = {
    "search": "blundell-prior-grid",
    "dataset": "digits",
    "max_examples": None,
    "validation_split": 1.0 / 6.0,
    "objective": "val_accuracy",
    "epochs": 5,
    "batch_size": 32,
    "hidden_units": 64,
    "depth": 2,
    "layer": "flipout",
    "learning_rate": 3e-3,
    "schedule": "constant",
    "max_trials": None,
    "top": 10,
    "seed": 0,
    "workers": 0,
    "port": None,
    "verbose": 0,
}

# The chief's and workers' program: `python -m tfbnn.cli.tune` started as the `tfbnn` command
# is (through its entry module), so TensorFlow loads after parsing with its start-up log filtered.
_CHILD_MAIN = (
    "import sys, _tfbnn_command; from tfbnn.cli.tune import main; "
    "sys.exit(main(sys.argv[1:]))"
)

#: The options of the blundell-prior-grid search, each a LIST (None: the search's default):
#: dest -> (type, help).
GRID_OPTIONS = {
    "pi": (argtypes.number_list, "mixture weights, each in (0, 1) (default: 0.25,0.5,0.75)"),
    "neg_log_sigma1": (argtypes.number_list, "values of -log sigma1 (default: 0,1,2)"),
    "neg_log_sigma2": (argtypes.number_list, "values of -log sigma2 (default: 6,7,8)"),
    "sigma1": (argtypes.number_list, "values of sigma1 itself (> 0), instead of --neg-log-sigma1"),
    "sigma2": (argtypes.number_list, "values of sigma2 itself (> 0), instead of --neg-log-sigma2"),
    "tune_learning_rate": (argtypes.number_list, "also search these Adam learning rates"),
    "tune_hidden_units": (argtypes.int_list, "also search these widths (units per hidden layer)"),
    "tune_schedule": (argtypes.name_list(SCHEDULE_NAMES),
                      f"also search these KL schedules ({', '.join(SCHEDULE_NAMES)})"),
}

# Options that are not passed on to the chief and workers of --workers.
_LAUNCHER_ONLY = {"help", "workers", "port", "overwrite", "output"}


# -- parsing ---------------------------------------------------------------------------


def _join(values):
    return ",".join(repr(v) if isinstance(v, float) else str(v) for v in values)


DESCRIPTION = (
    "Run a KerasTuner search over a tfbnn model and report the best trials.\n"
    "\n"
    "blundell-prior-grid is the prior search of Blundell et al. (2015, sec. 5.1): a BbB MLP\n"
    "under the scale-mixture prior  pi N(0, sigma1^2) + (1 - pi) N(0, sigma2^2)  for every\n"
    "pi in {1/4, 1/2, 3/4}, -log sigma1 in {0, 1, 2}, -log sigma2 in {6, 7, 8}: a GridSearch\n"
    "that runs each of the 27 combinations exactly once. Each trial trains for --epochs on\n"
    "the training split minus the last --validation-split of it, with tfbnn.KLAnnealing\n"
    "and N = the examples it actually trains on, and is scored on that held-out part\n"
    "(the test split is not used). --pi / --neg-log-sigma1 / --neg-log-sigma2 change the\n"
    "grid; --tune-learning-rate / --tune-hidden-units / --tune-schedule add dimensions.\n"
    "\n"
    "KerasTuner prints each trial as it runs. At the end: a table of the top trials (pi,\n"
    "sigma1, sigma2, validation accuracy and NLL at the trial's best epoch), and in --output\n"
    "results.csv (every trial), heatmap.png (best value per prior, a panel per pi),\n"
    "fits.jsonl (which process trained what) and the KerasTuner project search/.\n"
    "\n"
    "Resume: run the same command again. Completed trials are kept and not re-run; a trial\n"
    "cut off mid-way runs again. --overwrite starts over (the settings must match to resume).\n"
    "\n"
    "Distributed: --workers W starts KerasTuner's chief (the oracle, over gRPC on\n"
    "127.0.0.1) and W worker processes on this machine; only the chief may overwrite.\n"
    "On several machines run this same command on each with KERASTUNER_TUNER_ID=chief\n"
    "(one machine) or tuner0, tuner1, ... and KERASTUNER_ORACLE_IP / KERASTUNER_ORACLE_PORT\n"
    "set to the chief's address (see tuners/README.md)."
)
EPILOG = (
    "examples:\n"
    "  tfbnn tune\n"
    "  tfbnn tune --search blundell-prior-grid --dataset digits --epochs 10 --objective val_nll\n"
    "  tfbnn tune --pi 0.25,0.5 --neg-log-sigma2 6,7,8,9 --tune-learning-rate 1e-3,3e-3\n"
    "  tfbnn tune --dataset moons --max-examples 400 --epochs 3 --workers 2"
)


def add_arguments(parser):
    """The options of ``tfbnn tune``."""
    d = TUNE_DEFAULTS
    search = parser.add_argument_group("search")
    search.add_argument("--search", choices=SEARCH_NAMES, default=d["search"],
                        help="blundell-prior-grid: the 27-point scale-mixture prior grid (GridSearch); "
                        "ibnn-random: K, sigma0, prior s and the variational learning rate of a node-based "
                        "iBNN MLP (tfbnn.layers.NodeDense; RandomSearch, --max-trials, default 20)")
    search.add_argument("--objective", choices=OBJECTIVE_NAMES, default=d["objective"],
                        help="val_accuracy (max); val_nll (min): the validation negative log-likelihood; "
                        "val_loss (min): the validation NLL + beta KL / N")
    search.add_argument("--max-trials", type=argtypes.positive_int, default=d["max_trials"], metavar="T",
                        help="stop after T trials (default: the whole grid; 20 for ibnn-random)")
    search.add_argument("--seed", type=argtypes.non_negative_int, default=d["seed"],
                        help="seeds the data split, every trial's initialization and sampling (trials "
                        "differ only by their hyperparameters) and the random search")

    grid = parser.add_argument_group("grid (blundell-prior-grid)")
    for dest, (kind, text) in GRID_OPTIONS.items():
        grid.add_argument("--" + dest.replace("_", "-"), type=kind, default=None, metavar="LIST", help=text)

    data = parser.add_argument_group("data")
    data.add_argument("--dataset", choices=DATASET_NAMES, default=d["dataset"],
                      help="digits and moons are offline; mnist and fashion_mnist download on first use")
    data.add_argument("--max-examples", type=argtypes.positive_int, default=d["max_examples"], metavar="N",
                      help="use at most N examples (moons: the number generated before its 80/20 split)")
    data.add_argument("--validation-split", type=argtypes.open_unit_interval, default=d["validation_split"], metavar="F",
                      help="the last fraction F of the training split validates (Keras' rule); the "
                      "rest trains and is N of the ELBO (default: %(default).4g = 1/6; Blundell held out "
                      "10,000 of MNIST's 60,000)")

    model = parser.add_argument_group("model and training (fixed unless tuned)")
    model.add_argument("--epochs", type=argtypes.positive_int, default=d["epochs"], help="epochs per trial")
    model.add_argument("--batch-size", type=argtypes.positive_int, default=d["batch_size"], help="minibatch size")
    model.add_argument("--hidden-units", type=argtypes.positive_int, default=d["hidden_units"], metavar="UNITS",
                       help="units per hidden layer")
    model.add_argument("--depth", type=argtypes.positive_int, default=d["depth"], help="number of hidden layers")
    model.add_argument("--layer", choices=LAYER_NAMES, default=d["layer"],
                       help="tfbnn dense layer (gradient estimator)")
    model.add_argument("--learning-rate", type=argtypes.positive_float, default=d["learning_rate"], metavar="LR",
                       help="Adam learning rate")
    model.add_argument("--schedule", choices=SCHEDULE_NAMES, default=d["schedule"],
                       help="KL schedule (constant: beta = 1, the plain ELBO; ramps last half the run)")
    model.add_argument("--run-eagerly", action="store_true",
                       help="train without tf.function: faster when trials are a few steps each "
                       "(tracing then dominates), slower otherwise")
    model.add_argument("--verbose", type=int, choices=(0, 1, 2), default=d["verbose"],
                       help="Keras fit verbosity inside each trial (KerasTuner's own progress is always shown)")

    run = parser.add_argument_group("output, resume and distribution")
    run.add_argument("--output", default=None, metavar="DIR",
                     help="results folder (default: tuners/results/<search>-<dataset>)")
    run.add_argument("--overwrite", action="store_true",
                     help="delete the search in --output and start over (default: resume it)")
    run.add_argument("--top", type=argtypes.positive_int, default=d["top"], metavar="K", help="trials in the table")
    run.add_argument("--workers", type=argtypes.non_negative_int, default=d["workers"], metavar="W",
                     help="0: run the trials in this process; W > 0: a KerasTuner chief and W workers on "
                     "this machine (gRPC on 127.0.0.1)")
    run.add_argument("--port", type=argtypes.port, default=d["port"],
                     help="the chief's gRPC port with --workers (default: a free one)")
    parser.set_defaults(tune_parser=parser)


# -- helpers --------------------------------------------------------------------------


def _output(args):
    return args.output or os.path.join("tuners", "results", f"{args.search}-{args.dataset}")


def _space(args, search):
    from tfbnn import tuning

    if search.space_class is tuning.BlundellPriorSpace:
        try:
            return tuning.BlundellPriorSpace(
                pi=args.pi if args.pi is not None else tuning.BLUNDELL_PI,
                neg_log_sigma1=args.neg_log_sigma1,
                neg_log_sigma2=args.neg_log_sigma2,
                sigma1=args.sigma1,
                sigma2=args.sigma2,
                learning_rate=args.tune_learning_rate,
                hidden_units=args.tune_hidden_units,
                schedule=args.tune_schedule,
            )
        except ValueError as e:  # the space's extra dimensions are the --tune-* flags
            message = str(e)
            for name in ("learning_rate", "hidden_units", "schedule"):
                message = re.sub(rf"(`{name}`|(?<![\w-]){name}(?==))", f"--tune-{name.replace('_', '-')}", message)
            raise ValueError(message) from None
    given = [o for o in GRID_OPTIONS if getattr(args, o) is not None]
    if given:
        option = "--" + given[0].replace("_", "-")
        raise ValueError(f"{option} applies to the blundell-prior-grid search only. Received: --search={args.search}")
    return search.space_class()


def _settings(args, space):
    """What determines the results: a resumed search must have the same."""
    keys = ("search", "dataset", "max_examples", "validation_split", "objective", "epochs", "batch_size",
            "hidden_units", "depth", "layer", "learning_rate", "schedule", "seed")
    return {**{k: getattr(args, k) for k in keys}, "space": space.get_config()}


def _check_settings(folder, settings, overwrite):
    path = os.path.join(folder, "settings.json")
    if overwrite or not os.path.exists(path):
        return
    with open(path) as f:
        saved = json.load(f)
    # JSON has no tuples; compare through it.
    current = json.loads(json.dumps(settings))
    diff = [k for k in sorted(set(saved) | set(current)) if saved.get(k) != current.get(k)]
    if diff:
        k = diff[0]
        raise ValueError(
            f"{folder} holds a search with other settings ({k}: {saved.get(k)!r} there, {current.get(k)!r} "
            "now); resume it with the same options, start over with --overwrite, or choose another "
            f"--output. Received: --output={folder}"
        )


def _write_settings(folder, settings):
    write_json(os.path.join(folder, "settings.json"), settings)


def _prepare_folder(folder):
    prepare_output_dir(folder, "--output")


def child_argv(args):
    """The options of this run, minus the launcher's own, for the chief and the workers."""
    argv = ["tune"]
    for action in args.tune_parser._actions:
        dest = action.dest
        if not action.option_strings or dest in _LAUNCHER_ONLY:
            continue
        value = getattr(args, dest, None)
        if value is None or value == action.default:
            continue
        flag = action.option_strings[-1]
        if value is True:
            argv.append(flag)
        elif isinstance(value, tuple):
            argv += [flag, _join(value)]
        else:
            argv += [flag, repr(value) if isinstance(value, float) else str(value)]
    return argv


def _fmt(value, spec=".4f"):
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    return format(value, spec)


def _top_table(records, space, objective, top):
    completed = [r for r in records if r["rank"] is not None]
    dims = list(space.dimensions())
    prior = ("pi", "neg_log_sigma1", "neg_log_sigma2")
    has_prior = all(k in dims for k in prior)
    extra = [k for k in dims if not (has_prior and k in prior)]
    header = ["rank", "trial"] + (["pi", "-log s1", "-log s2", "sigma1", "sigma2"] if has_prior else [])
    header += extra + ["val accuracy", "val NLL", "epoch"]
    rows = [tuple(header)]
    for r in completed[:top]:
        row = [str(r["rank"]), r["trial_id"]]
        if has_prior:
            row += [_fmt(r.get("pi"), "g"), _fmt(r.get("neg_log_sigma1"), "g"), _fmt(r.get("neg_log_sigma2"), "g"),
                    _fmt(r.get("sigma1"), ".3g"), _fmt(r.get("sigma2"), ".3g")]
        row += [_fmt(r.get(k), "g") if isinstance(r.get(k), (int, float)) else str(r.get(k)) for k in extra]
        row += [_fmt(r.get("val_accuracy")), _fmt(r.get("val_nll")), str(r.get("best_epoch") or "-")]
        rows.append(tuple(row))
    title = (f"Top {min(top, len(completed))} of {len(completed)} completed trials ({len(records)} run), "
             f"by {objective}; metrics at each trial's best epoch")
    return format_table(title, [rows])


def _report(tuner, space, args, folder, n_train):
    from tfbnn import tuning

    records = tuning.trial_records(tuner)
    csv_path = os.path.join(folder, "results.csv")
    tuning.write_csv(records, csv_path)
    completed = [r for r in records if r["rank"] is not None]
    lines = [f"results: {csv_path}"]
    if completed and isinstance(space, tuning.BlundellPriorSpace):
        metric = args.objective
        plot = tuning.plot_prior_grid(
            records, os.path.join(folder, "heatmap.png"), metric=metric,
            title=f"{args.search} on {args.dataset}: best {metric} per prior ({args.epochs} epochs, N = {n_train})",
        )
        lines.append(f"heat map: {plot}")
    print()
    print(_top_table(records, space, args.objective, args.top))
    print()
    print("\n".join(lines), flush=True)
    failed = [r for r in records if r["status"] != "COMPLETED"]
    if failed:
        raise CommandError(
            f"{len(failed)} of {len(records)} trials did not complete (e.g. trial {failed[0]['trial_id']}: "
            f"{failed[0]['status']}); see {os.path.join(folder, 'search')}. Run the command again to retry "
            "trials that were cut off."
        )


# -- tune --------------------------------------------------------------------------------


def run(args):
    """``tfbnn tune``: returns the exit status."""
    from tfbnn import tuning

    search = tuning.get_search(args.search)
    space = _space(args, search)
    folder = _output(args)
    role = tuning.distributed_role()
    if args.workers and role is not None:
        raise ValueError(
            f"--workers starts its own chief and workers; this process is already the KerasTuner {role} "
            f"(KERASTUNER_TUNER_ID={os.environ.get('KERASTUNER_TUNER_ID')!r}). Received: --workers={args.workers}"
        )
    _prepare_folder(folder)
    settings = _settings(args, space)
    if role != "worker":
        _check_settings(folder, settings, args.overwrite)
    if args.workers:
        return _launch(args, folder)
    return _run_search(args, search, space, folder, role, settings)


def _launch(args, folder):
    from tfbnn import tuning

    port = args.port or tuning.free_port()
    print(f"{PROG} tune: a KerasTuner chief and {args.workers} worker(s) on 127.0.0.1:{port} "
          f"(workers' output: {os.path.join(folder, 'worker-tuner*.log')})", flush=True)
    chief_argv = child_argv(args) + ["--output", folder] + (["--overwrite"] if args.overwrite else [])
    command = [sys.executable, "-c", _CHILD_MAIN, *chief_argv]
    # Workers run the same command; an --overwrite on one would be ignored (chief only), so leave it out.
    try:
        status = tuning.launch_distributed(command, args.workers, port=port, log_dir=folder,
                                           workers_wait_for_chief=True)
    except KeyboardInterrupt:  # the launcher has stopped the chief and the workers
        print(f"{PROG}: interrupted; completed trials are kept in {os.path.join(folder, 'search')}: run the same "
              "command to resume", file=sys.stderr)
        return 130
    if status != 0:
        raise CommandError(
            f"the distributed search failed (exit status {status}); see the chief's output above and "
            f"{os.path.join(folder, 'worker-tuner*.log')}. Completed trials are kept: run the command again "
            "to resume."
        )
    return 0


def _load_data(args):
    """The in-memory dataset of the search (``--max-examples`` caps moons' generation and the tfds sets)."""
    kwargs = {"seed": args.seed} if args.dataset in datasets.OFFLINE_DATASETS else {}
    if args.max_examples is not None:
        if args.dataset == "digits":
            raise ValueError("--max-examples applies to moons, mnist and fashion_mnist, not digits. "
                             f"Received: --max-examples={args.max_examples}")
        kwargs["num_examples" if args.dataset == "moons" else "max_examples"] = args.max_examples
    try:
        return datasets.load(args.dataset, **kwargs)
    except RuntimeError as e:
        raise CommandError(str(e)) from None


def _space_names(space):
    """The names of the space's dimensions, in words (for the header)."""
    import keras_tuner

    hp = keras_tuner.HyperParameters()
    space.declare(hp)
    return [p.name for p in hp.space]


def _freeze_long_lived():
    """Freezes what survives a full collection (``gc.freeze``), so that KerasTuner's collection before each
    trial scans only what the trials make; returns whether the search unfreezes afterwards.

    Only a process in which nothing was frozen is unfrozen after the search. One that froze objects itself
    (a server after its start-up, a test runner) keeps its freeze: ``gc.unfreeze`` cannot tell whose
    objects it thaws, and undoing the caller's freeze would have every later full collection scan its
    whole heap again. What the search froze then stays frozen with the caller's (reference counting still
    frees those objects; the cyclic collector no longer scans them).
    """
    first = not gc.get_freeze_count()
    gc.collect()
    gc.freeze()
    return first


def _run_search(args, search, space, folder, role, settings):
    from tfbnn import tuning

    overwrite = args.overwrite and role != "worker"
    if args.overwrite and role == "worker":
        print(f"{PROG} tune: --overwrite ignored on worker {os.environ.get('KERASTUNER_TUNER_ID')!r} "
              "(only the chief may overwrite)", file=sys.stderr)
    if overwrite:
        for name in ("results.csv", "heatmap.png", "fits.jsonl", "settings.json"):
            path = os.path.join(folder, name)
            if os.path.exists(path):
                os.remove(path)

    ds = _load_data(args)
    model_text = (f"iBNN MLP, {args.depth} x {args.hidden_units} NodeDense units" if args.search == "ibnn-random"
                  else f"BbB MLP, {args.depth} x {args.hidden_units} {args.layer} units")
    (x_train, _), (x_val, _) = tuning.split_validation(ds.x_train, ds.y_train, args.validation_split)
    n_train, n_val = len(x_train), len(x_val)
    hypermodel = search.hypermodel_class(
        ds.input_shape, ds.num_classes, space=space, hidden_units=args.hidden_units, depth=args.depth,
        layer=args.layer, learning_rate=args.learning_rate, schedule=args.schedule, batch_size=args.batch_size,
        epochs=args.epochs, validation_split=args.validation_split, seed=args.seed,
        run_eagerly=args.run_eagerly, fit_log=os.path.join(folder, "fits.jsonl"), verbose=args.verbose,
    )
    if role == "worker":  # the chief owns the folder (and may be overwriting it) until it serves
        try:
            tuning.wait_for_chief()
        except RuntimeError as e:
            raise CommandError(str(e)) from None
    max_trials = args.max_trials
    if max_trials is None and search.tuner_class is tuning.RandomSearch:
        max_trials = 20
    project = os.path.join(folder, "search")
    resuming = not overwrite and os.path.exists(os.path.join(project, "oracle.json"))
    try:
        tuner = search.tuner_class(
            hypermodel, objective=args.objective, max_trials=max_trials, seed=args.seed,
            directory=folder, project_name="search", overwrite=overwrite,
        )
    except NotImplementedError as e:
        raise CommandError(str(e)) from None
    if role != "worker":
        _write_settings(folder, settings)
        tuner.oracle.verbose = 1  # KerasTuner's per-trial progress (the oracle lives here)

    total = space.size if max_trials is None else min(space.size, max_trials)
    who = {None: "", "chief": " [chief: serving the oracle, the workers train]",
           "worker": f" [worker {os.environ.get('KERASTUNER_TUNER_ID')}]"}[role]
    print(f"{PROG} tune: {args.search} on {ds.name}{who}\n"
          f"  data:    N = {n_train} training / {n_val} validation examples, {ds.num_classes} classes\n"
          f"  space:   {type(space).__name__} over {', '.join(_space_names(space))}: {total} trials x "
          f"{args.epochs} epochs, objective {args.objective} "
          f"({tuning.OBJECTIVES[args.objective]})\n"
          f"  model:   {model_text}, Adam lr "
          f"{args.learning_rate:g}, KL schedule {args.schedule}, batch {args.batch_size}\n"
          f"  project: {project}", flush=True)
    if resuming and role != "worker":
        done = sum(1 for t in tuner.oracle.trials.values() if t.status == "COMPLETED")
        print(f"  resuming: {done} completed trial(s) kept, not re-run", flush=True)

    # KerasTuner runs gc.collect() before every trial: freezing the long-lived objects
    # already here (TensorFlow, Keras, the data) saves about a third of a second each.
    unfreeze = _freeze_long_lived()
    try:
        tuner.search(ds.x_train, ds.y_train, epochs=args.epochs)
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted; completed trials are kept in {project}: run the same command to resume",
              file=sys.stderr)
        return 130
    except RuntimeError as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CommandError(f"the search stopped: {first} (trial records in {project})") from None
    finally:
        if unfreeze:
            gc.unfreeze()

    if role == "worker":
        print(f"{PROG} tune: worker {os.environ.get('KERASTUNER_TUNER_ID')} done", flush=True)
        return 0
    _report(tuner, space, args, folder, n_train)
    return 0


# -- standalone entry point ---------------------------------------------------------------


def build_parser():
    """The ``tfbnn`` parser with the ``tune`` subcommand's options."""
    return command_parser("tune")


def main(argv=None):
    """``python -m tfbnn.cli.tune tune ...``: the exit status, as :func:`tfbnn.cli.main` returns it."""
    return argtypes.run_parsed(build_parser(), argv)

if __name__ == "__main__":
    sys.exit(main())
