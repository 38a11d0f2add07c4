"""``tfbnn export``: a saved model as a SavedModel with sample / mean / uncertainty endpoints."""

import os

from tfbnn._internal import argtypes
from tfbnn.cli.evaluate import load_model

__all__ = ["DESCRIPTION", "add_arguments", "run", "model_task"]


DESCRIPTION = (
    "Export a .keras model as a TensorFlow SavedModel that serves without tfbnn\n"
    "(tf.saved_model.load). Endpoints: sample(x), sample_seeded(x, seed), mean(x),\n"
    "summary(x) and summary_seeded(x, seed) (a T-sample summary: mean_probs,\n"
    "predictive_entropy, aleatoric, epistemic for classifiers; mean and standard deviations\n"
    "for regression). serving_default is the summary (what a serving client wants: the\n"
    "prediction with its uncertainty). Unseeded endpoints draw fresh samples in every process;\n"
    "seeded ones (int32 or int64 seeds) reproduce."
)


def add_arguments(parser):
    """The options of ``tfbnn export``."""
    parser.add_argument("model", type=argtypes.existing_model, help="a .keras file")
    parser.add_argument("--output", default=None, metavar="DIR",
                        help="SavedModel folder; default: MODEL without .keras + '_savedmodel'")
    parser.add_argument("--num-samples", type=argtypes.positive_int, default=100, metavar="T",
                        help="samples of the summary endpoints")
    parser.add_argument("--task", choices=("auto", "classification", "regression"), default="auto",
                        help="what the summary endpoints compute: classification (the model outputs "
                        "probabilities: a softmax head, or a tfbnn Bernoulli / categorical head), regression (a "
                        "tfbnn.GaussianHead or another regression distribution head, or a point output); auto "
                        "decides from the model's output layer")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing export folder")


def _output_layer(model):
    """The model's last layer; for a :class:`tfbnn.DeepEnsemble`, its first member's."""
    from tfbnn.ensembles import DeepEnsemble

    return (model.members[0] if isinstance(model, DeepEnsemble) else model).layers[-1]


def model_task(model):
    """A distribution head's task; ``"classification"`` when the model's output layer is a softmax,
    ``"regression"`` otherwise (for a :class:`tfbnn.DeepEnsemble`, its first member's output layer)."""
    import keras

    from tfbnn.likelihoods import DistributionHead

    layer = _output_layer(model)
    if isinstance(layer, DistributionHead):
        return layer.task
    activation = getattr(layer, "activation", None)
    return "classification" if activation is keras.activations.softmax else "regression"


def run(args):
    """``tfbnn export``: returns the exit status."""
    from tfbnn.ensembles import DeepEnsemble
    from tfbnn.export import export_saved_model
    from tfbnn.utils import stochastic_layers

    output = args.output or args.model[: -len(".keras")] + "_savedmodel"
    model = load_model(args.model)
    task = model_task(model)
    if args.task != "auto" and args.task != task:
        layer = _output_layer(model)
        activation = getattr(getattr(layer, "activation", None), "__name__", None)
        reason = f"its activation is {activation}" if activation else f"it ends in a {type(layer).__name__}"
        raise ValueError(f"the model's output layer makes it a {task} model ({reason}). Received: --task={args.task}")
    if os.path.exists(output) and not args.overwrite:
        raise ValueError(f"the export folder {output!r} exists; pass --overwrite to replace it. Received: "
                         f"--output={output}")
    export_saved_model(model, output, num_samples=args.num_samples, task=task, overwrite=args.overwrite)
    samples = f"T = {args.num_samples}"
    if isinstance(model, DeepEnsemble):  # its members are the samples
        samples = (f"{model.num_members} members x T = {args.num_samples}" if stochastic_layers(model)
                   else f"its {model.num_members} members as the samples")
    print(f"Exported {args.model} ({task}) to {output}/ with endpoints sample, sample_seeded, mean, summary, "
          f"summary_seeded ({samples}).\nServe it with: served = "
          f"tf.saved_model.load({output!r}); served.summary(x)")
    return 0
