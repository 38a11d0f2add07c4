"""One training routine: :func:`run` fits, evaluates and records a :class:`Recipe`.

What :func:`run` does, in order:

1. seeds Keras (``keras.utils.set_random_seed(recipe.seed)``) and loads the dataset as
   ``tf.data`` pipelines (:func:`tfbnn.datasets.load_pipeline`: seeded validation
   hold-out, CIFAR standardization and augmentation); ``N`` of the ELBO is the number
   of training examples actually used; text (IMDB, the synthetic reviews) becomes token
   ids through a ``keras.layers.TextVectorization`` adapted on the training split
   (``model_options`` ``vocab_size`` and ``max_length``, default 20,000 and 120);
2. builds the model through the zoo (:func:`tfbnn.models.build`), or builds the
   deterministic zoo model, pre-trains it ``pretrain_epochs`` and converts it
   (:func:`tfbnn.convert.to_bayesian`) for frequentist pre-training and Graves (a
   ``deterministic`` recipe with ``pretrain_epochs`` goes on training a copy with a
   fresh optimizer: the baseline trained as long as the converted models);
3. compiles with the recipe's optimizer and learning-rate schedule
   (:func:`tfbnn.training.make_optimizer`) and fits with
   :class:`tfbnn.KLAnnealing` (``beta`` from :func:`tfbnn.training.kl_schedule`),
   a NaN guard and per-epoch timing; with ``train_samples = S > 1`` iBNN trains through
   :class:`tfbnn.ibnn.IBNNModel` and the other methods through
   :class:`tfbnn.MultiSampleModel` (S weight samples per step, outputs averaged);
4. evaluates the Monte Carlo predictive on the test split
   (:func:`tfbnn.evaluation.evaluate_classifier`): accuracy, NLL, ECE, Brier score,
   total / aleatoric / epistemic uncertainty on clean and Gaussian-shifted inputs and
   how well they detect the shift (the epistemic side by the method's own score,
   :attr:`tfbnn.methods.Method.epistemic`: SNGP's GP variance, DDU's feature density) (AUROC; text: a fraction ``SHIFT_GAMMA`` of the tokens
   replaced at random); with ``recipe.temperature_scaling`` it fits
   a temperature to the predictive on the validation hold-out
   (:meth:`tfbnn.TemperatureScaling.fit_prediction`) and evaluates the tempered
   predictive too;
5. writes ``recipe.json``, ``history.csv``, ``history.json``, ``learning_curves.png``,
   ``results.json`` and ``model.keras``.

What depends on the method (how its model is made, the conversion, the multi-sample
model, the test samples, the optimizer, XLA, its name in the tables) is read from its
entry in the method registry (:class:`tfbnn.methods.Method`), not from its name.

Outputs are atomic: everything is written to a hidden staging folder beside the
output folder and moved into place only after the run succeeded, so a run that
fails (the loss became NaN, a dataset could not be loaded) leaves neither an empty
folder nor a half-written file, and never replaces the results of an earlier run.
"""

import contextlib
import dataclasses
import math
import os
import sys
import textwrap
import time

from tfbnn import datasets
from tfbnn import methods as registry
from tfbnn._internal import files
from tfbnn._internal.errors import RunError
from tfbnn.training.recipe import Recipe
from tfbnn.training.recipes import resolve

__all__ = ["run", "RunResult", "fit_model", "build_model", "convert_model", "deterministic_version", "load_data", "arrays",
           "results_table", "interpretation", "fit_temperature",
           "SHIFT_GAMMA", "DEFAULT_ROOT"]

#: Gaussian shift of the clean-vs-shifted comparison: x' = (1 - g) x + g eps.
SHIFT_GAMMA = 0.5
#: Parent of the default output folders (git-ignored with saved_models/).
DEFAULT_ROOT = os.path.join("saved_models", "runs")

@dataclasses.dataclass
class RunResult:
    """What :func:`run` returns.

    Attributes:
        recipe: the :class:`Recipe` that ran.
        model: the trained Keras model (``csgmcmc``: the :class:`tfbnn.DeepEnsemble` of its samples).
        test: dict of test metrics (``accuracy``, ``nll``, ``ece``, ``brier``,
            ``confidence``, ``predictive_entropy``, ``aleatoric``, ``epistemic`` (the mutual
            information), ``epistemic_own`` (the mean of the method's own epistemic score,
            :attr:`tfbnn.methods.Method.epistemic`; None without one), and the same under
            ``shifted``; ``shift_detection``: AUROC of the predictive entropy and of the
            method's own epistemic score (None without one), clean against shifted, and
            ``epistemic_score``, its name;
            ``posterior_mean_accuracy`` for Bayesian models; ``kl``, for an ensemble
            the members' mean; ``num_samples``, for an ensemble all ``M * T`` (``csgmcmc``: its samples); with
            ``recipe.temperature_scaling``, ``temperature_scaled``: the fitted
            ``temperature``, ``num_validation`` and the tempered ``clean``,
            ``shifted`` and ``shift_detection``).
        history: list of per-epoch dicts (loss, accuracy, nll, val_*, kl_beta, seconds);
            for an ensemble one per member and epoch (with ``member``).
        num_examples: N, the training examples used.
        train_seconds: float.
        files: list of the written paths.
        output_dir: the folder holding the files.
        baseline: the deterministic baseline's test metrics, or None.
        comparison: the test metrics of the same recipe trained to another final
            ``beta`` (``comparison["beta"]``), or None.
        pretrained: the pre-trained deterministic model before its conversion (a
            Bayesian recipe with ``pretrain_epochs``; its weights as pre-training left
            them), or None.
    """

    recipe: Recipe
    model: object
    test: dict
    history: list
    num_examples: int
    train_seconds: float
    files: list
    output_dir: str
    baseline: object = None
    comparison: object = None
    pretrained: object = None


def _is_mlp(recipe):
    from tfbnn import models

    return recipe.model == "mlp" or recipe.model in models.PRESETS


def load_data(recipe):
    """The recipe's :class:`tfbnn.datasets.DataPipeline` (``N`` = its ``num_examples``).

    Raises:
        RunError: tensorflow-datasets could not provide the data.
    """
    try:
        data = datasets.load_pipeline(
            recipe.dataset, batch_size=recipe.batch_size, validation_fraction=recipe.validation_fraction,
            standardize=recipe.dataset in datasets.CIFAR_DATASETS, flatten=_is_mlp(recipe), seed=recipe.seed,
            max_examples=recipe.max_examples, max_test_examples=recipe.max_test_examples,
        )
    except RuntimeError as e:
        raise RunError(str(e)) from e
    if recipe.dataset in datasets.TEXT_DATASETS:  # token ids: the vocabulary from the training split only
        vocab_size, max_length = _text_sizes(recipe)
        vectorizer = datasets.text_vectorizer(data, max_tokens=vocab_size, output_sequence_length=max_length)
        data = datasets.vectorize_text(data, vectorizer)
    return data


#: A text recipe's vocabulary size and tokens per review unless its ``model_options`` set
#: ``vocab_size`` and ``max_length`` (the text vectorizer's ``max_tokens`` and sequence length).
_TEXT_DEFAULTS = {"vocab_size": 20_000, "max_length": 120}


def _text_sizes(recipe):
    sizes = {**_TEXT_DEFAULTS, **{k: v for k, v in recipe.model_options.items() if k in _TEXT_DEFAULTS}}
    return sizes["vocab_size"], sizes["max_length"]


def _convert_method(recipe):
    """The :func:`tfbnn.convert.to_bayesian` method converting to the recipe's (its :class:`tfbnn.methods.Method`)."""
    name = registry.get(recipe.method).conversion_name(recipe.method_options)
    if name is None:
        raise ValueError(f"Method {recipe.method!r} has no conversion from a deterministic model: pre-training "
                         f"and `convert_layers` apply to methods {list(registry.names(convertible=True))}. "
                         f"Received: method={recipe.method!r}")
    return name


def build_model(recipe, data):
    """The recipe's model for ``data`` (uncompiled), through the zoo.

    Methods of the zoo build directly. ``graves`` and recipes with
    ``pretrain_epochs`` build the deterministic zoo model; :func:`run` pre-trains and
    converts it (:func:`convert_model`).
    """
    from tfbnn import models

    if registry.get(recipe.method).build == "adapter":
        raise ValueError(f"Method {recipe.method!r} adapts a pre-trained network: no zoo recipe builds it. Build it "
                         f"with its own function and train it with tfbnn.training.fit_model. "
                         f"Received: method={recipe.method!r}")
    # The model's own fit to small images (tfbnn.models.input_options), unless the recipe sets them.
    options = {**models.input_options(recipe.model, data.input_shape), **recipe.model_options}
    seed = options.pop("seed", recipe.seed)  # a study may seed its models apart from the run
    common = dict(num_classes=data.num_classes, input_shape=data.input_shape, seed=seed, **options)
    if recipe.model in models.TEXT_MODELS:  # token ids: the input shape is (max_length,)
        common.pop("input_shape")
        common["vocab_size"], common["max_length"] = _text_sizes(recipe)
    if _converts(recipe):
        return models.build(recipe.model, method="deterministic", **common)
    return models.build(recipe.model, method=recipe.method, num_examples=data.num_examples,
                        **common, **recipe.method_options)


def _converts(recipe):
    """Whether the run builds the deterministic zoo model and converts it (after ``pretrain_epochs``)."""
    return (registry.get(recipe.method).build == "convert" or bool(recipe.pretrain_epochs)
            or "convert_layers" in recipe.method_options)


def deterministic_version(recipe):
    """The same recipe with deterministic layers (no KL, one sample, no pre-training)."""
    return recipe.replace(method="deterministic", method_options={}, pretrain_epochs=0, train_samples=1,
                          variational_learning_rate=None)


def convert_model(recipe, deterministic, num_examples):
    """The Bayesian copy of a (pre-trained) deterministic model (:func:`tfbnn.convert.to_bayesian`)."""
    from tfbnn import convert

    options = dict(recipe.method_options)
    init_scale = options.pop("init_scale", 1e-3)
    kwargs = {k: options[k] for k in ("prior", "moped_delta") if k in options}
    if "convert_layers" in options:
        kwargs["layers"] = list(options["convert_layers"])
    return convert.to_bayesian(deterministic, method=_convert_method(recipe), init_scale=init_scale,
                               num_examples=num_examples, seed=recipe.seed, **kwargs)


#: ``jit_compile="auto"`` compiles with XLA only for runs of at least this many train steps: XLA's
#: compilation takes seconds (about 6 s for the digits MLP on 2 AMD cores) and saves about 2 ms a
#: step there, so a short run (a quick recipe, a smoke test) is slower with it (6.0 s against 1.9 s).
XLA_MIN_STEPS = 1_000


#: The network of :data:`tfbnn.methods.XLA_RULE` whose measurements decide ``jit_compile="auto"`` for a zoo model
#: (the MLP presets are ``"mlp"``); a model not listed (recurrent, Transformer, KerasHub, ConvNeXt's depthwise
#: blocks) was not measured: no XLA.
XLA_NETWORKS = {"lenet5": "lenet5", "alexnet": "resnet20", "resnet50": "resnet20", "vgg16": "resnet20",
                "vgg16_small": "resnet20", "wide_resnet28_10": "resnet20"}


def _xla_network(recipe):
    return "mlp" if _is_mlp(recipe) else XLA_NETWORKS.get(recipe.model)


def _jit(jit_compile, recipe, steps=None):
    if jit_compile != "auto":
        return bool(jit_compile)
    if steps is not None and steps < XLA_MIN_STEPS:
        return False
    import tensorflow as tf

    if tf.config.list_physical_devices("GPU"):
        return "auto"  # not measured on GPUs: Keras' own choice (XLA where the model supports it)
    # The measured rule (tfbnn.methods.XLA_RULE, benchmarks/README.md's dense and convolution tables).
    return registry.get(recipe.member_method).uses_xla(recipe.method_options, _xla_network(recipe))


def fixed_noise_gaussian_nll(noise_std):
    """A Keras loss: the per-example Gaussian NLL of linear outputs with the known noise scale (nats).

    ``0.5 ((y - f) / sigma)^2 + log sigma + 0.5 log(2 pi)``, averaged over output units: the
    loss of a ``likelihood="gaussian"`` recipe (``sigma = recipe.noise_std``).

    Example:
        >>> import numpy as np
        >>> loss = fixed_noise_gaussian_nll(2.0)
        >>> round(float(loss(np.array([[1.0]]), np.array([[3.0]]))[0]), 4)   # 0.5 + log 2 + 0.5 log(2 pi)
        2.1121
    """
    import keras

    log_norm = math.log(noise_std) + 0.5 * math.log(2 * math.pi)

    def gaussian_nll(y_true, y_pred):
        z = (keras.ops.cast(y_true, y_pred.dtype) - y_pred) / noise_std
        return keras.ops.mean(0.5 * keras.ops.square(z), axis=-1) + log_norm

    return gaussian_nll


def _steps_per_epoch(recipe, data):
    return recipe.steps_per_epoch or data.steps_per_epoch


def _compile(model, recipe, steps_per_epoch, jit_compile, batch_spec, from_logits=False, num_examples=None):
    """Compiles ``model`` for ``recipe`` and builds its training state from ``batch_spec`` (the
    training batches' element spec), so that ``fit`` traces the step once (:func:`tfbnn.utils.build_for_fit`)."""
    import keras

    from tfbnn.training.optim import make_optimizer
    from tfbnn.utils import build_for_fit

    if recipe.likelihood == "gaussian":
        loss, metrics = fixed_noise_gaussian_nll(recipe.noise_std), None
    elif from_logits:  # a network that outputs logits (a KerasHub task)
        loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        metrics = ["accuracy", keras.metrics.SparseCategoricalCrossentropy(name="nll", from_logits=True)]
    else:  # the method's loss (evidential: its own), the metrics of its predictive probabilities
        loss = registry.get(recipe.method).training_loss(recipe.method_options)
        metrics = _classifier_metrics(model)
    model.compile(optimizer=make_optimizer(recipe, steps_per_epoch, model, num_examples), loss=loss, metrics=metrics,
                  jit_compile=jit_compile)
    build_for_fit(model, batch_spec)


def fit_model(model, recipe, data, epochs=None, verbose=0, callbacks=(), jit_compile=False, from_logits=False):
    """Compiles and fits a ready ``model`` as :func:`run` trains a recipe's: the one compile-and-fit path.

    What :func:`run` does after building its model (its ``_train``), for a model built elsewhere (a
    fine-tuned KerasHub task, a head on frozen features, adapters): the recipe's optimizer and
    learning-rate schedule, the method's loss and callbacks (:class:`tfbnn.methods.Method`),
    :class:`tfbnn.KLAnnealing` for a Bayesian method, the NaN guard and per-epoch timing.

    Args:
        model: an uncompiled (or to be recompiled) ``keras.Model``.
        recipe: a :class:`Recipe` (its ``method``, optimizer, schedule, ``epochs``, batch size).
        data: a :class:`tfbnn.datasets.DataPipeline`; its ``train`` may be ``(x, y)`` arrays
            (``x`` a dict of arrays for a model of several inputs).
        epochs: int or None (``recipe.epochs``).
        verbose: Keras ``fit`` verbosity. Default 0.
        callbacks: extra Keras callbacks.
        jit_compile: bool. Default False.
        from_logits: bool; the model outputs logits: the loss and NLL read them as such
            (a method with its own loss cannot).

    Returns:
        The Keras ``History``.

    Raises:
        RunError: training diverged.
    """
    if from_logits and registry.get(recipe.method).loss is not None:
        raise ValueError(f"Method {recipe.method!r} has its own loss on its output layer's values, not logits. "
                         f"Received: from_logits=True")
    _compile(model, recipe, _steps_per_epoch(recipe, data), jit_compile, _element_spec(data.train), from_logits,
             data.num_examples)
    return _fit(model, recipe, data, recipe.epochs if epochs is None else epochs, verbose, callbacks)


def _classifier_metrics(model):
    """Accuracy and NLL of the class probabilities; of a distribution head's (an evidential model's
    ``alpha / S``) through :class:`tfbnn.metrics.HeadMean`."""
    import keras

    from tfbnn import likelihoods
    from tfbnn import metrics as metrics_lib

    metrics = [keras.metrics.SparseCategoricalAccuracy(name="accuracy"),
               keras.metrics.SparseCategoricalCrossentropy(name="nll")]
    head = likelihoods.output_layer(getattr(model, "network", model))  # a MultiSampleModel's network
    if isinstance(head, likelihoods.DistributionHead):
        metrics = [metrics_lib.HeadMean(m, head) for m in metrics]
    return metrics


def _fit(model, recipe, data, epochs, verbose, extra_callbacks, method_callbacks=None):
    from tfbnn import callbacks
    from tfbnn.training.optim import kl_schedule

    guard = callbacks.NaNGuard()
    if method_callbacks is None:
        method_callbacks = registry.get(recipe.method).training_callbacks(model, recipe.method_options)
    cbs = [guard, callbacks.EpochTimer(), *method_callbacks, *extra_callbacks]
    if recipe.is_bayesian:
        schedule = kl_schedule(recipe.kl_schedule, recipe.ramp_epochs, recipe.beta, recipe.warmup_epochs)
        cbs.insert(0, callbacks.KLAnnealing(num_examples=data.num_examples, schedule=schedule))
    steps = recipe.steps_per_epoch
    if isinstance(data.train, tuple):  # in-memory arrays: Keras batches them and reshuffles them every epoch
        x, y = data.train
        inputs = dict(x=x, y=y, batch_size=data.batch_size, shuffle=True)
    else:  # the pipeline shuffles (seeded) itself; fit's own shuffle does not apply to a dataset
        inputs = dict(x=data.train.repeat() if steps is not None else data.train, shuffle=False)
    if data.validation is None:  # tfbnn.distribute.fit: model.fit, or the loop that works across workers
        from tfbnn import distribute

        history = distribute.fit(model, **inputs, epochs=epochs, steps_per_epoch=steps, callbacks=cbs,
                                 verbose=verbose)
    else:
        history = model.fit(**inputs, validation_data=data.validation, epochs=epochs, steps_per_epoch=steps,
                            callbacks=cbs, verbose=verbose)
    if guard.where is not None or not _finite(history):
        what = guard.message() or "the loss became non-finite"
        raise RunError(f"training of {model.name} diverged: {what}; nothing was saved. "
                       f"Try a smaller learning rate (the recipe has learning_rate={recipe.learning_rate:g}).")
    return history


def _finite(history):
    return all(math.isfinite(v) for v in history.history.get("loss", [])) and bool(history.history.get("loss"))


def arrays(dataset):
    """``(x, y)`` NumPy arrays of a batched ``tf.data`` split (e.g. ``load_data(recipe).test``)."""
    import numpy as np

    xs, ys = zip(*((x.numpy(), y.numpy()) for x, y in dataset))
    return np.concatenate(xs), np.concatenate(ys)


def _eval_samples(recipe, model):
    return registry.get(recipe.member_method).num_eval_samples(model, recipe.eval_samples)


def _board_callbacks(folder, recipe, data):
    """Keras' TensorBoard and tfbnn's PosteriorBoard writing to ``folder`` (validation: a classifier's hold-out)."""
    import keras

    from tfbnn import callbacks

    validation = None
    if recipe.likelihood == "categorical" and data.validation is not None:
        validation = arrays(data.validation)
    board = callbacks.PosteriorBoard(os.fspath(folder), validation_data=validation,
                                     num_samples=min(recipe.eval_samples, 20))
    return [keras.callbacks.TensorBoard(os.fspath(folder)), board]


def fit_temperature(model, recipe, data, num_samples=None):
    """The :class:`tfbnn.TemperatureScaling` fitted to ``model``'s Monte Carlo predictive
    on the validation hold-out of ``data`` (``"pooled"``: ``softmax(log p_bar / T)``).

    Raises:
        ValueError: ``data`` has no validation split.
    """
    from tfbnn import calibration, inference

    if data.validation is None:
        raise ValueError("Temperature scaling needs a validation hold-out. "
                         f"Received: validation_fraction={recipe.validation_fraction}")
    t = num_samples or _eval_samples(recipe, model)
    x_val, y_val = arrays(data.validation)
    prediction = inference.predict(model, x_val, num_samples=t, batch_size=max(1, 2048 // t),
                                   task="classification")
    return calibration.TemperatureScaling().fit_prediction(prediction, y_val)


def _evaluate_regression(model, recipe, data):
    """Test numbers of a ``likelihood="gaussian"`` run: RMSE of the Monte Carlo predictive mean,
    the test NLL of the predictive mixture ``-log mean_t N(y | f_t(x), sigma^2)`` (log-mean-exp over
    the T samples, averaged over examples and outputs), the mean epistemic std, T and the KL."""
    import numpy as np

    from tfbnn import inference, utils

    x_test, y_test = arrays(data.test)
    t = _eval_samples(recipe, model)
    prediction = inference.predict(model, x_test, num_samples=t, task="regression", return_samples=True,
                                   batch_size=256)
    y = y_test.reshape(prediction.mean.shape).astype("float64")
    mu = prediction.samples.astype("float64")  # (T, n, d)
    sigma = recipe.noise_std
    log_p = -0.5 * ((y[None] - mu) / sigma) ** 2 - math.log(sigma) - 0.5 * math.log(2 * math.pi)
    peak = log_p.max(axis=0)
    nll = float(-np.mean(peak + np.log(np.mean(np.exp(log_p - peak), axis=0))))
    return {"rmse": float(np.sqrt(np.mean((prediction.mean - y) ** 2))), "nll": nll,
            "epistemic_std": float(np.mean(prediction.epistemic_std)), "num_samples": t, "num_test": len(y_test),
            "kl": float(utils.kl_divergence(model)) if utils.bayesian_layers(model) else 0.0}


def _evaluate(model, recipe, data):
    from tfbnn import evaluation, utils

    if recipe.likelihood == "gaussian":
        return _evaluate_regression(model, recipe, data)

    x_test, y_test = arrays(data.test)
    t = _eval_samples(recipe, model)
    # An ensemble runs M members with T samples each (T = 1 for deterministic members: exact).
    from tfbnn.ensembles import DeepEnsemble

    members = model.num_members if isinstance(model, DeepEnsemble) else recipe.num_members  # csgmcmc: its samples
    total = members * (t if utils.stochastic_layers(model) or not isinstance(model, DeepEnsemble) else 1)
    scaling = fit_temperature(model, recipe, data, t) if recipe.temperature_scaling else None
    # Token ids take no additive noise: text is shifted by replacing a fraction SHIFT_GAMMA of its tokens.
    corruption = "token_replacement" if recipe.dataset in datasets.TEXT_DATASETS else "gaussian"
    epistemic = registry.get(recipe.method).epistemic  # the method's own score (DDU: a density of the features)
    result = evaluation.evaluate_classifier(model, x_test, y_test, num_samples=t, num_bins=recipe.ece_bins,
                                            shift_gamma=SHIFT_GAMMA, sweep_levels=(), seed=recipe.seed,
                                            corruption=corruption,
                                            batch_size=max(1, 2048 // total), temperature=scaling,
                                            epistemic=epistemic, density=_density(model, epistemic, data))
    numbers = result.numbers
    test = {**numbers["clean"], "shifted": numbers["shifted"], "shift_detection": numbers["shift_detection"],
            "num_samples": total, "num_test": len(y_test)}
    for key in ("posterior_mean_accuracy", "posterior_mean_ece"):
        if key in numbers:
            test[key] = numbers[key]
    if scaling is not None:
        test["temperature_scaled"] = {**numbers["temperature_scaled"], "num_validation": data.num_validation}
    # An ensemble's KL is its members' mean: the KL term of each member's ELBO.
    test["kl"] = float(utils.kl_divergence(model)) / recipe.num_members if utils.bayesian_layers(model) else 0.0
    return test


def _density(model, epistemic, data):
    """DDU's Gaussian discriminant analysis of ``model``'s features, fitted on the training split
    (:class:`tfbnn.ddu.DDU`), for ``epistemic == "density"``; None otherwise."""
    if epistemic != "density":
        return None
    from tfbnn import ddu

    return ddu.DDU(model).fit(*(data.train if isinstance(data.train, tuple) else arrays(data.train)))


def _history_rows(history):
    if isinstance(history, _EnsembleHistory):  # one row per member and epoch
        return [{"member": m, **row} for m, h in enumerate(history.members) for row in _history_rows(h)]
    logs = history.history
    epochs = len(logs.get("loss", []))
    return [{"epoch": i + 1, **{k: float(v[i]) for k, v in logs.items() if i < len(v)}} for i in range(epochs)]


class _EnsembleHistory:
    """The members' Keras histories; ``history`` holds the per-epoch mean over members (the curves)."""

    def __init__(self, members):
        self.members = members
        keys = set.intersection(*(set(h.history) for h in members))
        self.history = {k: [sum(vs) / len(vs) for vs in zip(*(h.history[k] for h in members))] for k in sorted(keys)}


def _member_data(data, seed):
    """``data`` with its training split reshuffled by ``seed``: every member sees its own data order
    (Lakshminarayanan et al. 2017 train members on random orders), the same examples and hold-out."""
    import tensorflow as tf

    train = (data.train.unbatch().shuffle(max(1, data.num_examples), seed=seed, reshuffle_each_iteration=True)
             .batch(data.batch_size).apply(tf.data.experimental.assert_cardinality(data.train.cardinality()))
             .prefetch(tf.data.AUTOTUNE))
    return dataclasses.replace(data, train=train)


def _train_ensemble(recipe, data, verbose, jit_compile, extra_callbacks, strategy, quiet=False):
    """Trains the M members of an ``ensemble`` recipe one after the other; ``(DeepEnsemble, history, seconds)``."""
    import keras

    from tfbnn.ensembles import DeepEnsemble

    members, histories, seconds = [], [], 0.0
    for index in range(recipe.num_members):
        member = recipe.member_recipe(index)
        if not quiet:
            print(f"ensemble member {index + 1}/{recipe.num_members} (seed {member.seed})", flush=True)
        keras.utils.set_random_seed(member.seed)
        model, history, took = _train(member, _member_data(data, member.seed), verbose, jit_compile,
                                      extra_callbacks, strategy, quiet)
        members.append(model)
        histories.append(history)
        seconds += took
    return DeepEnsemble(members, name=f"ensemble_{members[0].name}"), _EnsembleHistory(histories), seconds


def _element_spec(train):
    """The training batches' ``(x, y)`` spec: a dataset's, or that of batches of in-memory arrays."""
    if not isinstance(train, tuple):
        return train.element_spec
    import tensorflow as tf

    return tf.nest.map_structure(lambda a: tf.TensorSpec((None, *a.shape[1:]), tf.as_dtype(a.dtype)), tuple(train))


def _train(recipe, data, verbose, jit_compile, extra_callbacks, strategy, quiet=False, keep=None):
    """Builds, (pre-trains and converts,) compiles and fits; returns ``(model, history, seconds)``
    (``keep["pretrained"]``: the pre-trained deterministic model, when ``keep`` is a dict)."""
    import keras

    if registry.get(recipe.method).build == "ensemble":
        return _train_ensemble(recipe, data, verbose, jit_compile, extra_callbacks, strategy, quiet)

    scope = strategy.scope() if strategy is not None else contextlib.nullcontext()
    per_epoch = _steps_per_epoch(recipe, data)
    jit = _jit(jit_compile, recipe, None if per_epoch is None else per_epoch * (recipe.epochs + recipe.pretrain_epochs))
    if strategy is not None:
        from tfbnn import distribute

        jit = distribute.jit_compile_for(strategy, jit, warn=jit_compile is True)
    start = time.perf_counter()
    batch_spec = _element_spec(data.train)
    with scope:
        model = build_model(recipe, data)
        if _converts(recipe):
            if recipe.pretrain_epochs:
                det = deterministic_version(recipe)
                _compile(model, det, _steps_per_epoch(det, data), jit, batch_spec)
                if not quiet:
                    print(f"pre-training the deterministic {model.name} for {recipe.pretrain_epochs} epochs",
                          flush=True)
                _fit(model, det, data, recipe.pretrain_epochs, verbose, ())
            if keep is not None and recipe.pretrain_epochs and recipe.method != "deterministic":
                keep["pretrained"] = model
            if recipe.method != "deterministic":
                model = convert_model(recipe, model, data.num_examples)
            else:  # goes on from a copy, as a conversion does (fresh layers: dropout's noise starts again)
                model = _copy(model)
        trainable = model
        if recipe.train_samples > 1:
            trainable = _multi_sample_model(recipe, model)
            trainable(keras.ops.zeros((1, *data.input_shape)))
        _compile(trainable, recipe, _steps_per_epoch(recipe, data), jit, batch_spec, num_examples=data.num_examples)
    if not quiet and (verbose or recipe.method != "deterministic"):
        print(_describe(recipe, model, data, strategy), flush=True)
    method = registry.get(recipe.method)
    method_callbacks = method.training_callbacks(trainable, recipe.method_options)
    history = _fit(trainable, recipe, data, recipe.epochs, verbose, extra_callbacks, method_callbacks)
    if method.finish is not None:  # csgmcmc: the collected samples as an ensemble (in a new scope: one enters once)
        with strategy.scope() if strategy is not None else contextlib.nullcontext():
            model = method.finish(model, method_callbacks)
    return model, history, time.perf_counter() - start


def _copy(model):
    """A copy of ``model`` with its weights (``keras.models.clone_model``)."""
    import keras

    copy = keras.models.clone_model(model)
    copy.set_weights(model.get_weights())
    return copy


def _multi_sample_model(recipe, model):
    """The model that trains ``model`` with ``recipe.train_samples`` samples per step (the method's:
    iBNN's :class:`tfbnn.ibnn.IBNNModel`, otherwise :class:`tfbnn.MultiSampleModel`)."""
    return registry.get(recipe.method).train_model(model, recipe.train_samples)


def _describe(recipe, model, data, strategy=None):
    options = ", ".join(f"{k}={v}" for k, v in recipe.method_options.items())
    opt = recipe.optimizer + (f" (momentum {recipe.momentum:g}{', Nesterov' if recipe.nesterov else ''})"
                              if recipe.optimizer == "sgd" else "")
    schedule = recipe.lr_schedule
    method = registry.get(recipe.method)
    if method.sampler is not None:  # csgmcmc: its sampler replaces the recipe's optimizer
        resolved = method.resolve_options(recipe.method_options)
        opt, schedule = resolved["sampler"].upper(), f"cyclical, {resolved['cycles']} cycles"
    lines = [
        f"{recipe.name}: {model.name} ({recipe.method}{': ' + options if options else ''}), "
        f"{model.count_params():,} parameters",
        f"  data:     {data.name}, N = {data.num_examples} training / {data.num_validation} validation / "
        f"{data.num_test} test examples, {data.num_classes} classes",
        f"  training: {recipe.epochs} epochs, batch {recipe.batch_size}, {opt} lr {recipe.learning_rate:g} "
        f"({schedule}), weight decay {recipe.weight_decay:g}, seed {recipe.seed}",
    ]
    if strategy is not None:
        lines.append(f"  strategy: {type(strategy).__name__}, {strategy.num_replicas_in_sync} replica(s)")
    if recipe.is_bayesian:
        tempered = (f" (< 1: a tempered, 'cold' posterior, each example counted {1 / recipe.beta:.3g} times "
                    "against the prior)" if 0 < recipe.beta < 1 else "")
        lines.append(f"  ELBO:     KL schedule {recipe.kl_schedule} to beta = {recipe.beta:g}{tempered}, "
                     f"{recipe.train_samples} {registry.get(recipe.method).samples_phrase} per step")
    if recipe.temperature_scaling:
        lines.append(f"  calibration: temperature scaling of the Monte Carlo predictive, fitted on the "
                     f"{data.num_validation} validation examples")
    return "\n".join(lines)


def _label(recipe):
    """The method's name in the results: its label (``BbB``), or ``ensemble of M <member method>``."""
    if registry.get(recipe.method).build == "ensemble":
        return f"ensemble of {recipe.num_members} {recipe.member_method}"
    return registry.get(recipe.method).display_name


def _columns(result):
    """``[(label, test metrics, is_bayesian_model)]``: the run, its beta comparison, the baseline."""
    r = result.recipe
    name = _label(r)
    columns = [(f"{name} beta={r.beta:g}" if r.is_bayesian else name, result.test, r.is_bayesian)]
    if result.comparison is not None:
        columns.append((f"{name} beta={result.comparison['beta']:g}", result.comparison, True))
    if result.baseline is not None:
        columns.append(("deterministic", result.baseline, False))
    return columns


def _row(name, columns, value, fmt, missing=""):
    """One table row: ``fmt`` of ``value(test)`` per column (``missing`` where it is None)."""
    cells = [value(t) for _, t, _ in columns]
    return (name, *(missing if v is None else fmt.format(v) for v in cells))


def _own_score(test):
    """The name of a column's own epistemic score (:data:`tfbnn.evaluation.EPISTEMIC_LABELS`)."""
    from tfbnn.evaluation import EPISTEMIC_LABELS

    return EPISTEMIC_LABELS[test["shift_detection"].get("epistemic_score", "mutual_information")]


def results_table(result):
    """The results of a :class:`RunResult` as aligned text (what :func:`run` prints).

    Columns: the run, the same recipe at another ``beta`` (``comparison``) and the
    deterministic baseline. Blocks: the run; test quality of the Monte Carlo
    predictive (raw and, with ``temperature_scaling``, temperature-scaled); shift
    detection (clean against Gaussian-shifted test inputs); the run's uncertainty split.
    """
    r, t = result.recipe, result.test
    if r.likelihood != "categorical" or "shift_detection" not in t:  # a regression run, or a study's own numbers
        rows = [("training examples (N)", result.num_examples),
                *((key, f"{value:.4f}" if isinstance(value, float) else value) for key, value in t.items()
                  if isinstance(value, (int, float, str))),
                ("training time", f"{result.train_seconds:.1f} s")]
        return files.format_table(f"Results: {r.name} ({r.model}, {r.method}) on {r.dataset}", [rows])
    cols = _columns(result)
    scaled = "temperature_scaled" in t

    def ts(key):
        return lambda x: x["temperature_scaled"]["clean"][key] if "temperature_scaled" in x else None

    quality = [("test metric (MC predictive)", *(label for label, _, _ in cols)),
               _row("accuracy", cols, lambda x: x["accuracy"], "{:.2%}"),
               _row("NLL", cols, lambda x: x["nll"], "{:.4f}")]
    if scaled:
        quality.append(_row("NLL, temperature-scaled", cols, ts("nll"), "{:.4f}"))
    quality.append(_row(f"ECE ({r.ece_bins} bins)", cols, lambda x: x["ece"], "{:.4f}"))
    if scaled:
        quality += [_row("ECE, temperature-scaled", cols, ts("ece"), "{:.4f}"),
                    _row("fitted temperature (validation)", cols,
                         lambda x: x["temperature_scaled"]["temperature"] if "temperature_scaled" in x else None,
                         "{:.3f}")]
    quality += [_row("Brier score", cols, lambda x: x["brier"], "{:.4f}"),
                _row("mean confidence", cols, lambda x: x["confidence"], "{:.2%}")]
    if "posterior_mean_accuracy" in t:
        quality.append(_row("accuracy, posterior mean", cols, lambda x: x.get("posterior_mean_accuracy"), "{:.2%}"))
    shift = [(f"shift (clean vs gamma={SHIFT_GAMMA:g})", *(label for label, _, _ in cols)),
             _row("AUROC, predictive entropy", cols, lambda x: x["shift_detection"]["auroc_entropy"], "{:.3f}"),
             _row("AUROC, epistemic (own score)", cols, lambda x: x["shift_detection"]["auroc_epistemic"], "{:.3f}",
                  "n/a"),
             ("epistemic score", *(_own_score(x) for _, x, _ in cols)),
             _row("epistemic, clean", cols, lambda x: x.get("epistemic_own", x["epistemic"]), "{:.4f}", "n/a"),
             _row("epistemic, shifted", cols, lambda x: x["shifted"].get("epistemic_own", x["shifted"]["epistemic"]),
                  "{:.4f}", "n/a"),
             _row("accuracy, shifted", cols, lambda x: x["shifted"]["accuracy"], "{:.2%}")]
    s = t["shifted"]
    run_rows = [("training examples (N)", result.num_examples), ("Monte Carlo samples", f"T = {t['num_samples']}")]
    if scaled:
        run_rows.append(("validation examples (for T)", t["temperature_scaled"]["num_validation"]))
    if r.is_bayesian:
        run_rows += [("KL(q || p) total", f"{t['kl']:.1f}"), ("KL / N (per example)", f"{t['kl'] / result.num_examples:.4f}")]
    final = result.history[-1]["loss"] if result.history else float("nan")
    run_rows += [("final training loss", f"{final:.4f}"), ("training time", f"{result.train_seconds:.1f} s")]
    return files.format_table(
        f"Results: {r.name} ({r.model}, {r.method}) on {r.dataset}",
        [
            run_rows,
            quality,
            shift,
            [
                (f"uncertainty of {cols[0][0]} (nats)", "clean", f"shifted (gamma={SHIFT_GAMMA:g})"),
                ("predictive entropy (total)", f"{t['predictive_entropy']:.4f}", f"{s['predictive_entropy']:.4f}"),
                ("expected entropy (aleatoric)", f"{t['aleatoric']:.4f}", f"{s['aleatoric']:.4f}"),
                _uncertainty_row(t),
            ],
        ],
    )


def _uncertainty_row(test):
    """The run's epistemic row: its own score on clean and shifted inputs ("n/a" for a method without one)."""
    name, s = _own_score(test), test["shifted"]
    if name == "mutual information":
        return "mutual information (epistemic)", f"{test['epistemic']:.4f}", f"{s['epistemic']:.4f}"
    own = (test.get("epistemic_own"), s.get("epistemic_own"))
    return (f"{name} (epistemic)", *("n/a" if v is None else f"{v:.4f}" for v in own))


def _confidence_word(test):
    gap = test["confidence"] - test["accuracy"]
    return "under-confident" if gap < 0 else "over-confident"


def interpretation(result):
    """A paragraph reading the :func:`results_table` of a Bayesian run with its baseline:
    the ``beta = 1`` trade-off, what tempering and temperature scaling change, and
    what only the Bayesian model's epistemic uncertainty shows. Every number quoted
    comes from ``result``; the words follow the numbers. ``""`` when there is no
    deterministic baseline or the method is not Bayesian."""
    r, base = result.recipe, result.baseline
    if base is None or not r.is_bayesian:
        return ""
    runs = {r.beta: result.test}
    if result.comparison is not None:
        runs[result.comparison["beta"]] = result.comparison
    name = _label(r)
    text = [f"Reading the table (N = {result.num_examples} training examples):"]
    for i, beta in enumerate(sorted(runs, reverse=True)):
        x = runs[beta]
        what = "the ELBO" if beta == 1 else f"a cold posterior, each example counted {1 / beta:.3g} times"
        acc_gap = round(100 * (x["accuracy"] - base["accuracy"]), 1)
        accurate = ("as accurate" if acc_gap == 0 else
                    f"{abs(acc_gap):.1f} points {'more' if acc_gap > 0 else 'less'} accurate")
        text.append(
            f"at beta = {beta:g} ({what}) {'the ' + name + ' predictive' if i == 0 else 'it'} is "
            f"{_confidence_word(x)} (mean confidence {x['confidence']:.1%} at accuracy {x['accuracy']:.1%}; "
            f"ECE {x['ece']:.3f}, NLL {x['nll']:.3f} against the deterministic {base['ece']:.3f}, {base['nll']:.3f}) "
            f"and {accurate}{';' if i + 1 < len(runs) else '.'}")
    scaled = [(f"at beta = {beta:g}", x) for beta, x in sorted(runs.items(), reverse=True)]
    scaled.append(("for the deterministic network", base))
    parts = [f"temperature {x['temperature_scaled']['temperature']:.2f} {label}: ECE {x['ece']:.3f} -> "
             f"{x['temperature_scaled']['clean']['ece']:.3f}, NLL {x['nll']:.3f} -> "
             f"{x['temperature_scaled']['clean']['nll']:.3f}" for label, x in scaled if "temperature_scaled" in x]
    if parts:
        text.append("Temperature scaling fitted on the validation hold-out recalibrates without retraining ("
                    + "; ".join(parts) + "; below 1 it sharpens, above 1 it softens) but leaves accuracy as it is.")
    betas = sorted(runs, reverse=True)
    detect = ", ".join(f"{runs[b]['shift_detection']['auroc_epistemic']:.3f} at beta = {b:g}" for b in betas)
    eps = ", ".join(f"{runs[b]['epistemic']:.3f} -> {runs[b]['shifted']['epistemic']:.3f}" for b in betas)
    text.append(
        f"Only the Bayesian model knows what it has not seen: its epistemic uncertainty rises on shifted inputs "
        f"({eps} nats) and separates them from clean ones with AUROC {detect}, where the deterministic network "
        f"has none (AUROC {_auroc_text(base['shift_detection']['auroc_epistemic'])}) and must rely on its "
        f"predictive entropy "
        f"(AUROC {base['shift_detection']['auroc_entropy']:.3f}; {result.test['shift_detection']['auroc_entropy']:.3f} "
        f"for {name} at beta = {r.beta:g}).")
    if len(betas) > 1:
        hi, lo = runs[betas[0]], runs[betas[-1]]
        verdict = "improved" if lo["nll"] < hi["nll"] else "did not improve"
        text.append(
            f"The smaller beta {verdict} the predictive here (NLL {hi['nll']:.3f} -> {lo['nll']:.3f}, accuracy "
            f"{hi['accuracy']:.1%} -> {lo['accuracy']:.1%}) and narrowed the posterior (epistemic uncertainty on "
            f"clean inputs {hi['epistemic']:.3f} -> {lo['epistemic']:.3f} nats): beta is a hyper-parameter, to be "
            "chosen on validation data, and below 1 the model is no longer the Bayes posterior of its prior.")
    return textwrap.fill(" ".join(text), 100, break_on_hyphens=False)


def _auroc_text(value):
    return "n/a" if value is None else f"{value:.2f}"


def _write_outputs(stage, result, history_obj, figures=True):
    from tfbnn import plots

    r = result.recipe
    files.write_json(os.path.join(stage, "recipe.json"), r.to_dict())
    files.write_csv(os.path.join(stage, "history.csv"), result.history, columns=["epoch"])
    files.write_json(os.path.join(stage, "history.json"), result.history)
    logs = {k: v for k, v in history_obj.history.items()
            if k.removeprefix("val_") in ("loss", "accuracy", "nll")}
    if figures:
        plots.save(plots.learning_curves(logs, title=f"{r.name}: {result.model.name} on {r.dataset}"),
                   os.path.join(stage, "learning_curves.png"))
    files.write_json(os.path.join(stage, "results.json"), {
        "recipe": r.name, "num_examples": result.num_examples, "train_seconds": result.train_seconds,
        "test": result.test, "baseline": result.baseline, "comparison": result.comparison,
    })


def _is_chief(strategy):
    if strategy is None:
        return True
    from tfbnn import distribute

    return distribute.is_chief(strategy)


def _publish(stage, output_dir):
    """Moves every staged file into ``output_dir`` (each move atomic); returns the paths."""
    os.makedirs(output_dir, exist_ok=True)
    paths = []
    for name in sorted(os.listdir(stage)):
        target = os.path.join(output_dir, name)
        os.replace(os.path.join(stage, name), target)
        paths.append(target)
    return paths


def run(recipe, output_dir=None, model_path=None, verbose=None, baseline=False, jit_compile="auto",
        strategy=None, callbacks=(), compare_beta=None, data=None, evaluate=None, quiet=False, figures=True,
        tensorboard=None):
    """Fits, evaluates and records ``recipe``; returns a :class:`RunResult`.

    Args:
        recipe: a :class:`Recipe`, a built-in recipe name (:func:`tfbnn.training.get_recipe`)
            or a path to a recipe JSON file.
        output_dir: folder of the outputs; default ``saved_models/runs/<recipe.name>``.
        model_path: where the ``.keras`` model goes; default ``<output_dir>/model.keras``.
        verbose: Keras ``fit`` verbosity (0, 1 progress bar, 2 a line per epoch);
            default 1 on a terminal, 2 otherwise.
        baseline: bool; also train the deterministic version of the same recipe and
            report its metrics beside (``RunResult.baseline``).
        jit_compile: ``"auto"``, True or False. ``"auto"``: on a CPU, XLA where the
            measured rule :data:`tfbnn.methods.XLA_RULE` says it made the train step faster
            for the method's layers, the network (:data:`XLA_NETWORKS`) and TensorFlow's
            kernel library (:func:`tfbnn.methods.kernel_library`), in runs of at least
            :data:`XLA_MIN_STEPS` train steps (where its compilation pays back); with a GPU,
            Keras' own ``"auto"`` (not measured here).
        strategy: a ``tf.distribute.Strategy`` or None; the model is built and
            compiled in its scope.
        callbacks: extra Keras callbacks for the (main) fit.
        compare_beta: float >= 0 or None; also train the same (Bayesian) recipe to
            this final ``beta`` (e.g. 1, the ELBO, beside a tempered run) and report
            its metrics beside (``RunResult.comparison``).
        data: a :class:`tfbnn.datasets.DataPipeline` to train and test on instead of
            the recipe's dataset (generated data: the 1-D regression sets, a study's
            sweeps); ``recipe.dataset`` then only names it. ``N`` of the ELBO is its
            ``num_examples``. Its ``train`` may be a tuple ``(x, y)`` of in-memory
            arrays: Keras then batches them (``data.batch_size``) and reshuffles them
            every epoch (``fit(shuffle=True)``, seeded by the run's seed).
        evaluate: None, or a function ``evaluate(model, recipe, data) -> dict`` of
            JSON-able test numbers that replaces the default evaluation
            (:func:`tfbnn.evaluation.evaluate_classifier` for ``"categorical"``; RMSE,
            test NLL and epistemic std of the predictive for ``"gaussian"``); a study's
            own analysis.
        quiet: bool; print nothing (a study running many recipes prints its own lines).
        figures: bool; write ``learning_curves.png`` (default True; a study running many recipes
            may skip the figure, about a second a run).
        tensorboard: a folder or None: Keras' ``TensorBoard`` callback and
            :class:`tfbnn.callbacks.PosteriorBoard` (the posterior per layer and, for a
            classifier with a validation hold-out, its Monte Carlo predictive) write there
            during the main fit (``tensorboard --logdir DIR``).

    Raises:
        ValueError: a bad recipe or argument (named).
        RunError: the run failed (training diverged, data unavailable, a file could
            not be written); nothing saved earlier was lost and no output was left.

    Example:
        >>> import os, tempfile, tfbnn
        >>> recipe = tfbnn.training.get_recipe("digits-bbb-mlp").quick()     # a smoke run, offline
        >>> result = tfbnn.training.run(recipe, output_dir=os.path.join(tempfile.mkdtemp(), "run"), verbose=0,
        ...                             jit_compile=False)
        digits-bbb-mlp: ...
        >>> 0.0 <= result.test["accuracy"] <= 1.0, len(result.files)
        (True, 6)
    """
    recipe = resolve(recipe)
    comparison_recipe = None
    if compare_beta is not None:
        if not recipe.is_bayesian:
            raise ValueError(f"`compare_beta` applies to a method with a KL term. Received: method={recipe.method!r}, "
                             f"compare_beta={compare_beta!r}")
        comparison_recipe = recipe.replace(beta=compare_beta)
    output_dir = output_dir or os.path.join(DEFAULT_ROOT, recipe.name)
    files.check_target(output_dir, "output_dir", create=False)  # folders are made once the data and model are
    if model_path is not None:
        if not str(model_path).endswith(".keras"):
            raise ValueError(f"Expected a model path ending in '.keras'. Received: model_path={model_path!r}")
        files.check_target(model_path, "model_path", create=False)
    if verbose is None:
        verbose = 1 if getattr(sys.stdout, "isatty", lambda: False)() else 2
    if tensorboard is not None and not isinstance(tensorboard, (str, os.PathLike)):  # before the data load
        raise ValueError(f"Expected `tensorboard` to be a folder path or None. Received: tensorboard={tensorboard!r}")

    import keras

    keras.utils.set_random_seed(recipe.seed)
    data = load_data(recipe) if data is None else data
    if tensorboard is not None:
        callbacks = (*callbacks, *_board_callbacks(tensorboard, recipe, data))
    evaluate = evaluate or _evaluate
    stage = files.make_staging_folder(output_dir)
    try:
        keras.utils.set_random_seed(recipe.seed)
        kept = {}
        model, history, seconds = _train(recipe, data, verbose, jit_compile, callbacks, strategy, quiet, kept)
        test = evaluate(model, recipe, data)
        comparison = None
        if comparison_recipe is not None:
            keras.utils.set_random_seed(recipe.seed)
            print(f"the same recipe at beta = {comparison_recipe.beta:g} ...", flush=True)
            other, _, _ = _train(comparison_recipe, data, 0, jit_compile, (), strategy)
            comparison = {"beta": comparison_recipe.beta, **evaluate(other, comparison_recipe, data)}
        base = None
        if baseline and recipe.method != "deterministic":
            det = deterministic_version(recipe)
            keras.utils.set_random_seed(recipe.seed)
            print("deterministic baseline (the same recipe with deterministic layers) ...", flush=True)
            det_model, _, _ = _train(det, data, 0, jit_compile, (), strategy)
            base = evaluate(det_model, det, data)
        result = RunResult(recipe=recipe, model=model, test=test, history=_history_rows(history),
                           num_examples=data.num_examples, train_seconds=seconds, files=[],
                           output_dir=output_dir, baseline=base, comparison=comparison,
                           pretrained=kept.get("pretrained"))
        if _is_chief(strategy):  # under several workers only the chief writes
            _write_outputs(stage, result, history, figures)
            # The model first (atomically): if it cannot be saved, nothing is published.
            saved = files.save_model(model, model_path or os.path.join(stage, "model.keras"))
            result.files = _publish(stage, output_dir) + ([saved] if model_path else [])
    finally:
        files.remove_staging_folder(stage)
    if quiet:
        return result
    print()
    print(results_table(result))
    reading = interpretation(result)
    if reading:
        print("\n" + reading)
    print(f"\nWrote {len(result.files)} files to {output_dir}/", flush=True)
    return result
