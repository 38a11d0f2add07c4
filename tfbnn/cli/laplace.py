"""``tfbnn laplace``: the Laplace approximation of a saved Keras model, fitted, tuned, saved and evaluated."""

import argparse
import json
import os

from tfbnn._internal import argtypes, files
from tfbnn._internal.errors import RunError
from tfbnn.datasets.catalog import CATALOG

__all__ = ["DESCRIPTION", "EPILOG", "add_arguments", "run", "DATASETS", "PREDICTIVES"]

#: Dataset names ``--data`` takes (besides a .npz file): the catalog's numeric datasets.
DATASETS = tuple(n for n, (kind, *_) in CATALOG.items() if kind != "text")
#: ``--predictive`` -> ``Laplace.predict`` arguments.
PREDICTIVES = {"glm": {"pred_type": "glm", "link_approx": "mc"}, "probit": {"pred_type": "glm", "link_approx": "probit"},
               "mc": {"pred_type": "nn"}}

#: Regression: the ECE is the mean |coverage - level| of the central intervals of these levels.
CALIBRATION_LEVELS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)

DESCRIPTION = (
    "Fit the Laplace approximation N(theta*, (H + delta I)^-1) of a trained Keras model (its weights are\n"
    "the MAP theta*; H the generalized Gauss-Newton) on the training split of --data, tune the prior\n"
    "precision delta (the marginal likelihood, or the NLL on a validation split), and evaluate the\n"
    "predictive on the test split: NLL, accuracy or RMSE, ECE (classification: confidence bins;\n"
    "regression: mean |coverage - level| of central intervals) and the 50% / 90% interval coverage,\n"
    "beside the MAP network's own numbers. Writes the approximation (tfbnn.laplace's .npz, loaded\n"
    "with tfbnn.laplace.load(path, model)), the evaluation (.json) and, for --subset last_layer, the\n"
    "sampling model (.keras: Laplace.to_model(), which tfbnn export serves) next to the model.\n"
    "\n"
    "--data is a dataset name or a .npz file with x_train, y_train, x_test, y_test (and optionally\n"
    "x_val, y_val); integer targets mean classification, float targets regression (--likelihood).\n"
    "Predictives: glm (the linearized network; classification: Monte Carlo softmax of its Gaussian),\n"
    "probit (the same Gaussian, probit approximation; classification only) and mc (weights sampled\n"
    "from the posterior and run through the network). The model must end in a Dense layer."
)
EPILOG = (
    "examples:\n"
    "  tfbnn laplace saved_models/digits_mlp.keras --data digits\n"
    "  tfbnn laplace model.keras --data data.npz --subset all --hessian diag --prior val_nll --predictive mc\n"
    "  tfbnn laplace model.keras --data digits --subset all --hessian kron --per-layer-prior\n"
    "  tfbnn laplace model.keras --data digits --subset subnetwork --subnetwork 500"
)


def _data_source(text):
    if text.endswith(".npz"):
        return text
    if text not in DATASETS:
        raise argparse.ArgumentTypeError(f"expected a .npz file or one of {', '.join(DATASETS)}; got {text!r}")
    return text


def add_arguments(parser):
    """The options of ``tfbnn laplace``."""
    parser.add_argument("model", type=argtypes.existing_model, help="a trained .keras model ending in a Dense layer")
    parser.add_argument("--data", type=_data_source, required=True, metavar="NAME|FILE.npz",
                        help=f"a dataset ({', '.join(DATASETS)}) or a .npz file with x_train, y_train, x_test, y_test")
    parser.add_argument("--likelihood", choices=("auto", "classification", "regression"), default="auto",
                        help="auto: classification for integer targets, regression for float ones")
    parser.add_argument("--subset", choices=("last_layer", "all", "subnetwork"), default="last_layer",
                        help="the weights treated (subnetwork: the --subnetwork N of largest variance)")
    parser.add_argument("--hessian", choices=("full", "kron", "diag"), default=None,
                        help="GGN structure (default: kron for the last layer, diag for all weights, full for a "
                             "subnetwork; kron with --subset all is KFAC per Dense/Conv2D layer)")
    parser.add_argument("--subnetwork", type=argtypes.positive_int, default=None, metavar="N",
                        help="--subset subnetwork: how many weights (those of largest variance under a diagonal "
                             "Laplace, Daxberger et al. 2021)")
    parser.add_argument("--per-layer-prior", action="store_true",
                        help="--prior marglik: one prior precision per layer (--subset all, kron or diag)")
    parser.add_argument("--prior", choices=("marglik", "val_nll", "fixed"), default="marglik",
                        help="how the prior precision is chosen: the marginal likelihood, the validation NLL, "
                             "or --prior-precision as given")
    parser.add_argument("--prior-precision", type=argtypes.positive_float, default=1.0, metavar="DELTA",
                        help="the prior precision (the start of the marginal-likelihood search)")
    parser.add_argument("--sigma-noise", type=argtypes.positive_float, default=1.0, metavar="SIGMA",
                        help="regression: the noise std (tuned with --prior marglik unless --fixed-noise)")
    parser.add_argument("--fixed-noise", action="store_true", help="regression: keep --sigma-noise as given")
    parser.add_argument("--predictive", choices=tuple(PREDICTIVES), default=None,
                        help="default: probit for classification, glm for regression")
    parser.add_argument("--num-samples", type=argtypes.positive_int, default=100, metavar="T",
                        help="samples of the glm (classification) and mc predictives")
    parser.add_argument("--validation-fraction", type=argtypes.rate, default=0.15, metavar="F",
                        help="--prior val_nll with a named dataset: the hold-out of the training split")
    parser.add_argument("--num-bins", type=argtypes.positive_int, default=15, help="ECE bins (classification)")
    parser.add_argument("--batch-size", type=argtypes.positive_int, default=None,
                        help="examples per curvature step (default 256 last layer, 32 all weights)")
    parser.add_argument("--seed", type=argtypes.non_negative_int, default=0,
                        help="seed of the data split and the Monte Carlo samples")
    parser.add_argument("--output", default=None, metavar="PREFIX",
                        help="writes PREFIX.npz, PREFIX.json (and PREFIX.keras, last layer); default: the model's "
                             "path without .keras + '_laplace'")
    parser.add_argument("--verbose", type=int, choices=(0, 1), default=1, help="1: a Keras progress bar per stage")


def _load_npz(path, need_validation):
    import numpy as np

    if not os.path.isfile(path):
        raise ValueError(f"Expected an existing .npz file. Received: --data={path}")
    with np.load(path, allow_pickle=False) as f:
        missing = [k for k in ("x_train", "y_train", "x_test", "y_test") if k not in f.files]
        if missing:
            raise ValueError(f"Expected arrays x_train, y_train, x_test, y_test in the .npz. Received: --data={path} "
                             f"without {', '.join(missing)}")
        arrays = {k: f[k] for k in f.files}
    val = (arrays["x_val"], arrays["y_val"]) if "x_val" in arrays and "y_val" in arrays else None
    if need_validation and val is None:
        raise ValueError(f"--prior val_nll needs x_val and y_val in the .npz. Received: --data={path}")
    return (arrays["x_train"], arrays["y_train"]), (arrays["x_test"], arrays["y_test"]), val


def _load_named(args, shape, need_validation):
    from tfbnn import datasets, training

    fraction = args.validation_fraction if need_validation else 0.0
    if need_validation and not fraction:
        raise ValueError("--prior val_nll needs a validation hold-out. Received: --validation-fraction=0")
    try:
        data = datasets.load_pipeline(args.data, batch_size=1024, validation_fraction=fraction,
                                      flatten=len(shape) == 1, seed=args.seed)
    except RuntimeError as e:
        raise RunError(str(e)) from e
    val = training.arrays(data.validation) if data.validation is not None else None
    return training.arrays(data.train), training.arrays(data.test), val


def _likelihood(args, y):
    import numpy as np

    if args.likelihood != "auto":
        return args.likelihood
    return "classification" if np.issubdtype(np.asarray(y).dtype, np.integer) else "regression"


def _progress(x, y, batch_size, verbose):
    """The training arrays as a ``tf.data`` pipeline whose batches advance a Keras progress bar."""
    import keras
    import numpy as np
    import tensorflow as tf

    n = len(x)
    bar = keras.utils.Progbar(-(-n // batch_size), verbose=verbose, unit_name="batch")

    def batches():
        for i, start in enumerate(range(0, n, batch_size)):
            yield x[start: start + batch_size], y[start: start + batch_size]
            bar.update(i + 1)

    spec = (tf.TensorSpec((None, *x.shape[1:]), tf.as_dtype(x.dtype)),
            tf.TensorSpec((None, *y.shape[1:]), tf.as_dtype(np.asarray(y).dtype)))
    return tf.data.Dataset.from_generator(batches, output_signature=spec)


def _evaluate(la, model, x, y, args, predictive):
    """The predictive's numbers (and the MAP network's) on ``(x, y)``."""
    import numpy as np

    from tfbnn import metrics

    options = dict(PREDICTIVES[predictive], num_samples=args.num_samples, seed=args.seed)
    if la.likelihood == "classification":
        probs = la.predict(x, **options)
        f_map = model.predict(x, verbose=0)
        if not np.allclose(f_map.sum(-1), 1.0, atol=1e-3):  # logits
            f_map = np.exp(f_map - f_map.max(-1, keepdims=True))
            f_map /= f_map.sum(-1, keepdims=True)

        def scores(p):
            return {"nll": metrics.negative_log_likelihood(p, y), "accuracy": metrics.accuracy(p, y),
                    "ece": metrics.expected_calibration_error(p, y, num_bins=args.num_bins),
                    "brier": metrics.brier_score(p, y)}

        return scores(probs), scores(f_map)
    y = np.asarray(y, np.float64).reshape(len(x), -1)
    pred = la.predict(x, **{k: v for k, v in options.items() if k != "link_approx"})
    mean, std = np.asarray(pred.mean, np.float64), np.asarray(pred.total_std, np.float64)
    f_map = np.asarray(model.predict(x, verbose=0), np.float64).reshape(mean.shape)
    sigma = np.full(mean.shape, la.sigma_noise)

    def scores(m, s):
        nll = float(np.mean(np.sum(0.5 * np.log(2 * np.pi * s**2) + 0.5 * ((y - m) / s) ** 2, axis=-1)))
        covered = np.asarray(metrics.interval_coverage(y, m, s, CALIBRATION_LEVELS))
        return {"nll": nll, "rmse": float(np.sqrt(np.mean((y - m) ** 2))),
                "ece": float(np.mean(np.abs(covered - CALIBRATION_LEVELS))),
                **dict(zip(("coverage_50", "coverage_90"), metrics.interval_coverage(y, m, s, (0.5, 0.9))))}

    return scores(mean, std), scores(f_map, sigma)


def _table(evaluation):
    la, base = evaluation["laplace"], evaluation["map"]
    rows = [("test metric", "Laplace", "MAP")]
    rows += [(k, f"{la[k]:.4f}", f"{base[k]:.4f}") for k in la]
    return rows


def run(args):
    """``tfbnn laplace``: returns the exit status."""
    import time

    import numpy as np

    from tfbnn import laplace
    from tfbnn.cli.evaluate import load_model

    prefix = args.output or args.model[: -len(".keras")] + "_laplace"
    files.check_target(prefix, "output", create=False)  # made only when the results are written
    need_val = args.prior == "val_nll"
    model = load_model(args.model)
    shape = tuple(model.inputs[0].shape[1:])
    if args.data.endswith(".npz"):
        train, test, val = _load_npz(args.data, need_val)
    else:
        train, test, val = _load_named(args, shape, need_val)
    (x, y), (x_test, y_test) = train, test
    if tuple(x.shape[1:]) != shape:
        raise ValueError(f"the model expects inputs of shape {shape}, the data have {tuple(x.shape[1:])}. "
                         f"Received: --data={args.data}")
    likelihood = _likelihood(args, y)
    predictive = args.predictive or ("probit" if likelihood == "classification" else "glm")
    if predictive == "probit" and likelihood == "regression":
        raise ValueError("the probit predictive is for classification. Received: --predictive=probit with "
                         "regression targets")
    if likelihood == "regression" and y.ndim == 1:
        y, y_test = y[:, None], y_test[:, None]
        val = None if val is None else (val[0], val[1][:, None])
    start = time.perf_counter()
    if args.per_layer_prior and args.prior != "marglik":
        raise ValueError(f"--per-layer-prior tunes by the marginal likelihood. Received: --prior={args.prior}")
    la = laplace.Laplace(model, likelihood=likelihood, subset=args.subset, hessian=args.hessian,
                         prior_precision=args.prior_precision, sigma_noise=args.sigma_noise,
                         subnetwork=args.subnetwork)
    batch = args.batch_size or (256 if args.subset == "last_layer" else 32)
    if args.verbose:
        print(f"Fitting the {la.hessian} GGN of {la.num_parameters} weights ({args.subset}) on {len(x)} examples")
    la.fit(_progress(x, y, batch, args.verbose), batch_size=batch)
    if args.prior != "fixed":
        options = {"x_val": val[0], "y_val": val[1]} if need_val else {
            "tune_sigma_noise": likelihood == "regression" and not args.fixed_noise}
        if args.per_layer_prior:
            options["per_layer"] = True
        la.optimize_prior_precision(method=args.prior, seed=args.seed, **options)
    seconds = time.perf_counter() - start
    if args.verbose:
        delta = ", ".join(f"{d:.4g}" for d in np.ravel(la.prior_precision))
        print(f"prior precision {delta}" + (f", noise std {la.sigma_noise:.4g}"
                                                               if likelihood == "regression" else "")
              + f" ({args.prior}); evaluating on {len(x_test)} test examples")
    ours, base = _evaluate(la, model, x_test, y_test, args, predictive)
    evaluation = {
        "model": os.path.abspath(args.model), "data": args.data, "likelihood": likelihood, "subset": la.subset,
        "hessian": la.hessian, "prior": args.prior, "prior_precision": np.asarray(la.prior_precision).tolist(),
        "sigma_noise": la.sigma_noise if likelihood == "regression" else None,
        "log_marginal_likelihood": float(la.log_marginal_likelihood()), "predictive": predictive,
        "num_parameters": la.num_parameters, "num_train": int(len(x)), "num_test": int(len(x_test)),
        "fit_seconds": round(seconds, 3), "laplace": ours, "map": base,
    }
    np_path = prefix + ".npz"
    os.makedirs(os.path.dirname(os.path.abspath(prefix)), exist_ok=True)
    la.save(np_path + ".tmp.npz")
    os.replace(np_path + ".tmp.npz", np_path)
    written = [np_path]
    if la.subset == "last_layer":  # the sampling model: what `tfbnn export` serves
        keras_path = prefix + ".keras"
        la.to_model(seed=args.seed).save(prefix + ".tmp.keras")
        os.replace(prefix + ".tmp.keras", keras_path)
        written.append(keras_path)
    json_path = files.write_text(prefix + ".json", json.dumps(evaluation, indent=2) + "\n")
    print(files.format_table(f"Laplace ({la.subset}, {la.hessian}, {predictive} predictive) of {args.model} on "
                             f"{args.data} ({len(x_test)} test examples)", [_table(evaluation)]))
    print(f"\nWrote {', '.join(written)} and {json_path}")
    if la.subset == "last_layer":
        print(f"Serve it: tfbnn export {written[-1]} --format saved_model|tflite|onnx")
    return 0
