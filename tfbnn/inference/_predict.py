"""``predict``: Monte Carlo prediction of a model or deep ensemble, fixed T or adaptive."""

import contextlib
import dataclasses

import keras
import numpy as np
import tensorflow as tf

from tfbnn._internal import checks, deprecation, keras_private
from tfbnn import moments
from tfbnn.ensembles import DeepEnsemble
from tfbnn.layers.rank1 import EnsembleMean, ensemble_size, members_as_samples
from tfbnn.inference._adaptive import AdaptiveBatch, AdaptiveSampling, sample_adaptively, sampling_rule
from tfbnn.inference._sampling import (
    check_dropout,
    check_finite,
    check_input_shapes,
    compiled_sampler,
    input_batches,
    input_signature,
    reference_model,
)
from tfbnn.inference._summaries import (
    ClassificationPrediction,
    RegressionPrediction,
    class_probabilities,
    concat,
    summarize_classification,
    summarize_regression,
)
from tfbnn.inference._weights import FittedPosterior
from tfbnn.likelihoods import DistributionHead, GaussianHead, output_layer
from tfbnn.utils import stochastic_layers, weight_samples

TASKS = ("auto", "classification", "regression")
#: Values of :func:`predict`'s ``method``.
METHODS = ("monte_carlo", "moments")


# Until the next release predict also takes AdaptiveSampling's fields as keywords (with num_samples="auto").
@deprecation.keywords_moved("num_samples", AdaptiveSampling, "tfbnn.inference.AdaptiveSampling", when="auto")
def predict(
    model,
    x,
    num_samples=100,
    batch_size=None,
    return_samples=False,
    task="auto",
    from_logits=False,
    gaussian_head=None,
    mc_dropout=False,
    joint=False,
    head=None,
    method="monte_carlo",
    seed=None,
    moments_covariance="diagonal",
):
    """Monte Carlo prediction: T posterior predictive samples per example, summarised.

    Each batch ``(B, ...)`` is tiled sample-major to ``(T * B, ...)`` and run once,
    inside :func:`tfbnn.utils.weight_samples`, through a ``tf.function`` cached per
    model, T and inference modes (``training=False``; the Bayesian layers keep
    their inference modes, so a model in ``"mean"`` mode gives T identical samples
    and zero mutual information). Classification returns
    ``predictive_entropy = H[mean_t p_t]`` (total), ``expected_entropy =
    mean_t H[p_t]`` (aleatoric) and ``mutual_information`` (epistemic, their
    difference; Depeweg et al. 2018, Trinh et al. 2022 eq. 26-27). Regression
    returns the mean, ``epistemic_std = std_t mu_t`` and, for a model ending in a
    regression distribution head, ``aleatoric_std = sqrt(mean_t v_t)``.

    **Distribution heads** (:mod:`tfbnn.likelihoods`). A model whose output layer is
    a distribution head is summarised through the distribution of each sample's
    output ``theta_t``: a regression head (:class:`GaussianHead`, ``StudentTHead``,
    ``MixtureNormalHead``, a regression ``DistributionLambdaHead``) by the law of total
    variance, ``mu_t = E[y | theta_t]``, ``v_t = Var[y | theta_t]`` (the mixture's own
    mean and variance for a mixture density network)::

        mean = mean_t mu_t,   epistemic_std^2 = var_t mu_t,   aleatoric_std^2 = mean_t v_t

    (an evidential head, :class:`tfbnn.evidential.EvidentialRegressionHead`, adds its own
    single-pass ``Var[mu]`` to the epistemic part: ``epistemic_std^2 = var_t mu_t + mean_t
    Var[mu]_t``, with ``v_t`` its ``E[sigma^2]``),
    and a classification head (``BernoulliHead``, ``CategoricalHead``) by the entropy
    split above, on the head's class probabilities (``BernoulliHead``: one binary
    classification per label, results ``(N, d)`` and ``mean_probs (N, d, 2)``).

    **Deep ensembles.** For a :class:`tfbnn.DeepEnsemble` of M members the members
    are posterior samples: every member is run with T samples in the same vectorized
    call, ``M * T`` samples in all, member-major (``samples[m * T + t]``), each member
    weighted ``1 / M``. ``num_samples`` (and the ``chunk_size``, ``min_samples`` and
    ``max_samples`` of an :class:`AdaptiveSampling`) count samples *per member*; the result's ``num_samples`` and
    ``samples_used`` count all ``M * T``. An ensemble without stochastic layers (the
    usual deep ensemble of deterministic networks) is run with ``T = 1``: its
    predictive is exact with M samples, whatever ``num_samples`` says.

    **Fitted posteriors.** For a :class:`FittedPosterior` (a fitted
    :class:`tfbnn.laplace.Laplace` of any subset and structure, a
    :class:`tfbnn.swag.SWAG` or :class:`tfbnn.swag.SWAGPosterior`, a
    :class:`tfbnn.hmc.HMCResult`) the T samples are T weight draws ``theta_t ~ q``
    (seeded by ``seed``), each run through the network over the whole batch (one
    function draw per sample, as ``joint=True``); ``num_samples`` must be an int. The
    posterior's task (Laplace's likelihood) or else the model's output layer decides
    the task as above. A posterior with a Gaussian noise scale (Laplace regression,
    HMC's ``"normal"`` likelihood) reports it as ``aleatoric_std``.

    **BatchEnsemble and rank-1 models.** A model ending in
    :class:`tfbnn.layers.EnsembleMean` (E members sharing their weights,
    :mod:`tfbnn.layers.rank1`) is read like a deep ensemble of E members: its
    ``EnsembleMean`` layers pass every member's rows through
    (:func:`tfbnn.layers.members_as_samples`), the samples are member-major
    (``samples[k * T + t]``) and ``num_samples`` counts samples per member. A
    BatchEnsemble model has no noise and is run with ``T = 1`` (E exact samples); a
    rank-1 model draws T samples from each member's posterior.

    **Adaptive sampling** (``num_samples=AdaptiveSampling(tolerance=..., ...)``, or
    ``"auto"`` for ``AdaptiveSampling()``). Samples are added in vectorized chunks until
    the Monte Carlo standard error of the predictive mean is at most ``tolerance``.
    With ``n`` samples per member, ``S`` members (1 for an ordinary model) and
    ``s_{m,c}^2`` the sample variance (``n - 1`` in the denominator) of component ``c``
    of member ``m``'s outputs (class probabilities, or regression means), the estimate
    ``p_bar_c = (1/S) sum_m mean_t p_{m,t,c}`` has the standard error (stratified
    sampling, members as strata)::

        se_c = sqrt( (sum_m s_{m,c}^2 / S  +  f / n) / (S n) )

    with ``f = 1`` for class probabilities and ``f = 0`` for regression. For ``S = 1``
    and ``f = 0`` it is the usual ``s_c / sqrt(n)``. The ``f / n`` term is Chow and
    Robbins' (1965) ``s_n^2 + 1/n`` in their fixed-width sequential rule: a probability
    whose samples so far are all equal (a class that a few percent of the posterior
    favours, not drawn yet) has ``s = 0``, and stopping then would miss it; the term
    asks for at least ``1 / tolerance`` samples before such an example stops, so a class
    with probability ``q`` is drawn with probability ``1 - exp(-q / tolerance)``. An
    example stops at the end of the first chunk with ``n >= min_samples`` and ``max_c
    se_c <= tolerance``, or at ``max_samples``; by the central limit theorem every
    component of the returned predictive mean is then within ``1.96 * tolerance`` with
    probability about 95% (asymptotically, as ``tolerance -> 0``). The variance between
    members is not Monte Carlo error (the members are fixed) and does not count. Chunk
    sizes follow Stein's two-stage idea, iterated: after each chunk the number of
    samples the median unfinished example still needs, ``n (se / tolerance)^2 - n``, as
    ``chunk_size * 2^j``, at least ``chunk_size`` and at most doubling ``n`` (few calls,
    few traces). ``per="example"`` (default) stops sampling each example when it meets
    the rule, so confident inputs use few samples and ambiguous ones many;
    ``per="batch"`` samples a whole batch until all its examples meet it. The result's
    ``samples_used`` ``(N,)`` and ``standard_error`` ``(N,)`` report each example's
    count and final ``max_c se_c``; the summaries are computed from running moments (no
    ``(T, N, C)`` array is kept unless ``return_samples``). A model without stochastic
    layers has no Monte Carlo error: it is run once with ``min_samples`` (a deep
    ensemble of such models with one sample per member) and reports
    ``standard_error = 0``. (Until the next release the fields of
    :class:`AdaptiveSampling` are still taken as keywords with ``num_samples="auto"``,
    as they were before, with a ``DeprecationWarning``.)

    Args:
        model: a Keras model with one output, a :class:`tfbnn.DeepEnsemble`, or a
            :class:`FittedPosterior` (Laplace, SWAG, HMC).
        x: inputs: an array or tensor ``(N, ...)``, a list/dict of them (multi-input
            models), or a batched ``tf.data.Dataset`` yielding ``x`` or
            ``(x, y, ...)``. Floating-point inputs must be finite (NaN or
            infinite values raise a ValueError naming the rows).
        num_samples: int >= 1, T; an :class:`AdaptiveSampling` (adaptive, above); or
            ``"auto"``, the same as ``AdaptiveSampling()``. Default 100. Memory grows
            as ``T * batch_size`` (the chunk size times ``batch_size`` when adaptive).
        batch_size: int or None, examples per vectorized call (default 32; must be
            None for a dataset).
        return_samples: bool, keep the ``(T, N, ...)`` samples in the result (NaN-padded
            past each example's ``samples_used`` when adaptive).
        task: ``"auto"`` (default), ``"classification"`` or ``"regression"``.
            ``"auto"`` reads the model, not the data: a distribution head's
            task; classification when ``from_logits=True`` or when the output
            layer ends in a softmax (a ``softmax`` activation, a
            ``keras.layers.Softmax`` or a :class:`tfbnn.layers.HeteroscedasticSoftmax`); regression for any other output layer. Only a model without a
            readable output layer (a subclassed model) falls back to its first
            batch's outputs (probability vectors: classification). A single
            sigmoid unit needs ``task="classification"`` (it is expanded to two
            classes).
        from_logits: bool, the outputs are logits: a softmax (sigmoid for one
            unit) is applied per sample before averaging.
        gaussian_head: bool or None. True: the outputs are ``(mean, scale)`` of a
            :class:`GaussianHead` (the same as ``head=GaussianHead()``); False: the
            outputs are not a head's, whatever the output layer; None (default):
            detect a head (see ``head``).
        mc_dropout: bool. MC dropout (Gal & Ghahramani 2016): keep the Keras
            ``Dropout`` / ``GaussianDropout`` / ``AlphaDropout`` layers on. The model
            is run through a cached view sharing all its layers with only those
            dropout layers switched on, so ``BatchNormalization`` keeps its moving
            statistics (calling the model with ``training=True`` would not, and
            would make Bayesian layers demand a KL scale). Needs a Sequential or
            functional model; dropout masks come from each dropout layer's seed
            generator.
        joint: bool. False (default): every example gets its own independent
            weight sample (per-example summaries need no more, and it is the
            cheapest). True: the examples of a batch share each of the T weight
            samples, so ``samples[t]`` is one function draw over the batch (see
            :func:`tfbnn.utils.weight_samples`). The summaries have the same
            distribution either way.
        head: a :class:`tfbnn.likelihoods.DistributionHead` whose parameters the
            outputs are, or None (default): the output layer of a Sequential or
            functional model when it is a head (a subclassed model needs ``head``).
        method: ``"monte_carlo"`` (default, all of the above) or ``"moments"``: one
            deterministic pass of moment propagation (:mod:`tfbnn.moments`, diagonal
            DVI after Wu et al. 2019), no samples. Classification: ``mean_probs`` by the
            probit approximation ``softmax(m / sqrt(1 + pi/8 v))`` of the logits' moments
            and ``predictive_entropy = H[mean_probs]``; ``expected_entropy`` and
            ``mutual_information`` (the aleatoric / epistemic split) need the
            distribution of the probabilities, which two moments do not give: they are
            NaN. Regression: ``mean`` and ``epistemic_std`` (the propagated standard
            deviation), and ``aleatoric_std`` behind a :class:`GaussianHead` (by
            Gauss-Hermite quadrature over its scale input); other heads are refused.
            ``num_samples`` is unused; ``samples`` is None, ``num_samples`` 0 and
            ``samples_used`` 0. Sequential or functional chains of the layers that
            :mod:`tfbnn.moments` supports; ``return_samples``, ``mc_dropout``, ``joint``,
            adaptive sampling, ensembles and fitted posteriors are Monte Carlo only.
        seed: int in ``[0, 2^31)`` or None (default), the seed of a fitted posterior's
            weight draws: the same seed gives the same draws. A Keras model's layers
            draw from their own seeds (their ``seed`` argument): pass None.
        moments_covariance: with ``method="moments"``, ``"diagonal"`` (default) or
            ``"full"``: :func:`tfbnn.moments.propagate`'s ``covariance``, the covariance
            between the units of each dense layer kept (Wu et al. 2019), for a variance
            that stays right in deeper networks at ``O(d^2)`` cost per unit count ``d``.

    Returns:
        A :class:`ClassificationPrediction` (``mean_probs (N, C)``, entropies
        ``(N,)``, ``samples (T, N, C)``, ``samples_used (N,)``) or a
        :class:`RegressionPrediction` (``mean (N, ...)``, stds, ``interval(level)``).

    Example:
        >>> import keras, numpy as np, tfbnn
        >>> model = keras.Sequential([
        ...     keras.Input((4,)),
        ...     tfbnn.layers.DenseFlipout(16, activation="relu", seed=1),
        ...     tfbnn.layers.DenseFlipout(3, activation="softmax", seed=2),
        ... ])
        >>> x = np.random.default_rng(0).random((10, 4)).astype("float32")
        >>> res = tfbnn.predict(model, x, num_samples=50)
        >>> res.mean_probs.shape, res.mutual_information.shape
        ((10, 3), (10,))
        >>> rule = tfbnn.inference.AdaptiveSampling(tolerance=0.01, max_samples=400)
        >>> auto = tfbnn.predict(model, x, num_samples=rule)
        >>> bool(np.all((auto.standard_error <= 0.01) | (auto.samples_used == 400)))
        True

    References:
        Chow, Robbins. On the Asymptotic Theory of Fixed-Width Sequential Confidence
        Intervals for the Mean. Ann. Math. Statist. 36, 1965.
        Stein. A Two-Sample Test for a Linear Hypothesis Whose Power is Independent
        of the Variance. Ann. Math. Statist. 16, 1945.
        Chan, Golub, LeVeque. Updating Formulae and a Pairwise Algorithm for
        Computing Sample Variances. Stanford CS report STAN-CS-79-773, 1979.
    """
    if method not in METHODS:
        raise ValueError(f"Expected `method` in {METHODS}. Received: method={method!r}")
    if seed is not None and not isinstance(model, FittedPosterior):
        raise ValueError("`seed` seeds a fitted posterior's weight draws; a Keras model's layers draw from their own "
                         f"seeds (their `seed` argument). Received: seed={seed!r} with model of type "
                         f"{type(model).__name__}")
    if moments_covariance not in moments.COVARIANCES:
        raise ValueError(f"Expected `moments_covariance` in {moments.COVARIANCES}. "
                         f"Received: moments_covariance={moments_covariance!r}")
    if method == "moments":
        return _predict_moments(model, x, num_samples, batch_size, return_samples, task, from_logits, gaussian_head,
                                mc_dropout, joint, head, moments_covariance)
    if moments_covariance != "diagonal":
        raise ValueError(f"`moments_covariance` is for method='moments'. Received: moments_covariance="
                         f"{moments_covariance!r}, method={method!r}")
    if isinstance(model, FittedPosterior):
        return _predict_weight_posterior(model, x, num_samples, batch_size, return_samples, task, from_logits,
                                         gaussian_head, mc_dropout, seed)
    batch_size = _check_args(model, batch_size, task, from_logits, gaussian_head)
    num_samples, rule = sampling_rule(num_samples)
    adaptive = rule is not None
    head = _resolve_head(model, head, gaussian_head, task, from_logits)
    check_dropout(model, mc_dropout)
    batches = iter(input_batches(x, batch_size))
    first = next(batches, None)
    if first is None:
        raise ValueError("Expected at least one batch of inputs. Received: an empty dataset")
    check_input_shapes(model, first)
    if not model.built:  # build outside the tf.function, with one sample per row
        check_finite(first, 0)
        model(first, training=False)
    strata = model.num_members if isinstance(model, DeepEnsemble) else ensemble_size(model)

    def as_samples():  # a deep ensemble's members each give their own mixture (EnsembleMean stays on)
        return contextlib.nullcontext() if isinstance(model, DeepEnsemble) else members_as_samples(model)

    exact = not stochastic_layers(model) and not mc_dropout
    if exact and (strata > 1 or adaptive):  # no noise: one sample per member is the exact predictive
        num_samples, rule = (1 if strata > 1 else rule.min_samples), None
    signature = input_signature(first)
    resolved = _task_from_model(task, model, from_logits, head)

    def resolve(samples):
        nonlocal resolved
        if resolved is None:
            resolved = _task_from_outputs(samples)
        if head is not None:
            _check_head_outputs(head, samples, gaussian_head)
        return resolved

    parts, seen = [], 0
    if rule is not None:
        def draw(batch, k):
            with weight_samples(model, k, joint=joint), as_samples():
                return compiled_sampler(model, k, joint, mc_dropout, signature)(batch).numpy()

        def make_batch(size):
            return lambda task_: AdaptiveBatch(task_, strata, size, from_logits, head, return_samples)

        for batch in _chain(first, batches):
            check_finite(batch, seen)
            size = int(tf.nest.flatten(batch)[0].shape[0])
            seen += size
            parts.append(sample_adaptively(draw, batch, rule, resolve, make_batch(size)))
        return concat(parts, strata)
    with weight_samples(model, num_samples, joint=joint), as_samples():
        sampler = compiled_sampler(model, num_samples, joint, mc_dropout, signature)
        for batch in _chain(first, batches):
            check_finite(batch, seen)
            seen += int(tf.nest.flatten(batch)[0].shape[0])
            samples = sampler(batch).numpy()
            if resolve(samples) == "classification":
                probs = samples if head is None else class_probabilities(samples, head=head)
                parts.append(summarize_classification(probs, from_logits, keep_samples=return_samples))
            else:
                parts.append(summarize_regression(samples, keep_samples=return_samples, head=head))
    result = concat(parts, strata)
    if exact and adaptive:  # no Monte Carlo error to report
        result = dataclasses.replace(result, standard_error=np.zeros(len(result.samples_used), np.float32))
    return result


def _predict_weight_posterior(posterior, x, num_samples, batch_size, return_samples, task, from_logits,
                              gaussian_head, mc_dropout, seed):
    """``predict`` for a :class:`FittedPosterior`: T weight draws, each a function draw over ``x``."""
    if not checks.is_integer(num_samples):
        raise ValueError("A fitted posterior (Laplace, SWAG, HMC) is sampled with a fixed number of weight draws. "
                         f"Received: num_samples={num_samples!r}")
    if mc_dropout:
        raise ValueError("`mc_dropout` does not apply to a fitted posterior (its samples are weight draws). "
                         "Received: mc_dropout=True")
    batch_size = _check_args(posterior.model, batch_size, task, from_logits, gaussian_head)
    if posterior.task is not None and task not in ("auto", posterior.task):
        raise ValueError(f"The posterior is a {posterior.task} posterior. Received: task={task!r}")
    if posterior.task is not None and (from_logits or gaussian_head):
        raise ValueError(f"A {type(posterior).__name__} posterior's outputs are read by the posterior. "
                         f"Received: from_logits={from_logits!r}, gaussian_head={gaussian_head!r}")
    samples = posterior.predictive_samples(x, num_samples, batch_size, seed=seed)
    if posterior.noise_scales(1) is not None or gaussian_head:
        head = GaussianHead()  # the draws' noise scales are appended to the outputs, a GaussianHead's layout
    elif posterior.task is not None:
        head = None
    else:
        head = _resolve_head(posterior.model, None, gaussian_head, task, from_logits)
    resolved = _task_from_model(posterior.task or task, posterior.model, from_logits, head)
    if resolved == "classification":
        probs = samples if head is None else class_probabilities(samples, head=head)
        return summarize_classification(probs, from_logits=from_logits and head is None,
                                        keep_samples=return_samples)
    return summarize_regression(samples, keep_samples=return_samples, head=head)


def _predict_moments(model, x, num_samples, batch_size, return_samples, task, from_logits, gaussian_head,
                     mc_dropout, joint, head, covariance="diagonal"):
    """``predict`` with ``method="moments"``: one moment-propagation pass per batch (:mod:`tfbnn.moments`)."""
    if isinstance(model, (FittedPosterior, DeepEnsemble)):
        raise ValueError("method='moments' propagates through one network's layers; an ensemble or weight "
                         f"posterior is sampled. Received: model of type {type(model).__name__}")
    monte_carlo_only = {"return_samples": return_samples, "mc_dropout": mc_dropout, "joint": joint}
    for name, value in monte_carlo_only.items():
        if value:
            raise ValueError(f"`{name}` is for method='monte_carlo'. Received: {name}={value!r}, method='moments'")
    if not checks.is_integer(num_samples):
        raise ValueError("Adaptive sampling is for method='monte_carlo'. "
                         f"Received: num_samples={num_samples!r}, method='moments'")
    batch_size = _check_args(model, batch_size, task, from_logits, gaussian_head)
    if head is not None or gaussian_head:
        raise ValueError("With method='moments' the head is read from the model (a GaussianHead at the output). "
                         f"Received: head={head!r}, gaussian_head={gaussian_head!r}")
    parts, seen = [], 0
    for batch in input_batches(x, batch_size):  # eager: one pass per batch, nothing to compile for
        check_input_shapes(model, batch)
        check_finite(batch, seen)
        seen += int(tf.nest.flatten(batch)[0].shape[0])
        if not model.built:
            model(batch, training=False)
        out = moments.propagate(model, batch, covariance=covariance)
        resolved = out.task(task, from_logits)
        summary = {k: v.numpy() for k, v in out.summary(resolved, from_logits).items()}
        parts.append(_moments_prediction(summary, resolved))
    if not parts:
        raise ValueError("Expected at least one batch of inputs. Received: an empty dataset")
    return concat(parts)


def _moments_prediction(summary, task):
    """The prediction object of a one-pass moments summary (no samples; the entropy split NaN)."""
    rows = len(next(iter(summary.values())))
    common = {"samples": None, "num_samples": 0, "samples_used": np.zeros(rows, np.int64)}
    if task == "classification":
        missing = np.full(rows, np.nan, np.float32)
        return ClassificationPrediction(mean_probs=summary["mean_probs"].astype(np.float32),
                                        predictive_entropy=summary["predictive_entropy"].astype(np.float32),
                                        expected_entropy=missing, mutual_information=missing.copy(), **common)
    aleatoric = summary.get("aleatoric_std")
    return RegressionPrediction(mean=summary["mean"].astype(np.float32),
                                epistemic_std=summary["epistemic_std"].astype(np.float32),
                                aleatoric_std=None if aleatoric is None else aleatoric.astype(np.float32), **common)


def _chain(first, rest):
    yield first
    yield from rest


# -- task resolution -------------------------------------------------------------------
def _output_layer(model):
    layer = output_layer(reference_model(model))
    while isinstance(layer, EnsembleMean):  # the members' output layer says what they predict
        layer = keras_private.inbound_layer(layer)
        if isinstance(layer, keras.Model):
            layer = output_layer(layer) or layer
    return layer


def _resolve_head(model, head, gaussian_head, task, from_logits):
    """The distribution head whose parameters the outputs are, or None."""
    if head is not None and not isinstance(head, DistributionHead):
        raise ValueError("Expected `head` to be a tfbnn.likelihoods distribution head or None. "
                         f"Received: head={head!r}")
    if head is not None and gaussian_head is not None:
        raise ValueError("Pass `head` or `gaussian_head`, not both. "
                         f"Received: head={head!r}, gaussian_head={gaussian_head!r}")
    if gaussian_head is not None:
        head = GaussianHead() if gaussian_head else None
    elif head is None:
        layer = _output_layer(model)
        head = layer if isinstance(layer, DistributionHead) else None
    if head is None:
        return None
    if task not in ("auto", head.task):
        raise ValueError(f"The model's {type(head).__name__} is a {head.task} head. Received: task={task!r}")
    if from_logits:
        raise ValueError(f"A {type(head).__name__} output is read by the head, not as logits. "
                         "Received: from_logits=True")
    return head


def _check_head_outputs(head, samples, gaussian_head):
    """The outputs' last dimension fits the head: a clear error before the summary."""
    try:
        head._event_size(samples.shape[-1], "outputs", tuple(samples.shape[1:]))
    except ValueError as e:
        if gaussian_head:
            raise ValueError(
                "Expected an even last output dimension (means, then scales) with `gaussian_head`. "
                f"Received: gaussian_head={gaussian_head!r}, outputs of shape {samples.shape[1:]}"
            ) from None
        raise ValueError(f"Expected the model's outputs to be the parameters of its {type(head).__name__} "
                         f"({e}). Received: head={head.name!r}") from None


def _ends_in_softmax(layer):
    if isinstance(layer, keras.layers.Softmax) or getattr(layer, "outputs_probabilities", False):
        return True
    activation = getattr(layer, "activation", None)
    return activation is not None and getattr(activation, "__name__", None) == "softmax"


def _looks_like_probabilities(samples):
    if samples.ndim < 3 or samples.shape[-1] < 2:
        return False
    return bool(np.all(samples >= -1e-6) and np.allclose(samples.sum(axis=-1), 1.0, atol=1e-3))


def _task_from_model(task, model, from_logits, head):
    """The task ``"auto"`` stands for, read from the model; None if it cannot tell."""
    if task != "auto":
        return task
    if head is not None:
        return head.task
    if from_logits:
        return "classification"
    layer = _output_layer(model)
    if layer is None:  # a subclassed model: no output layer to read
        return None
    return "classification" if _ends_in_softmax(layer) else "regression"


def _task_from_outputs(samples):
    """Last resort for a model without a readable output layer (a subclassed model)."""
    return "classification" if _looks_like_probabilities(samples) else "regression"


# -- argument checks -------------------------------------------------------------------
def _check_args(model, batch_size, task, from_logits, gaussian_head):
    if not isinstance(model, keras.layers.Layer):
        raise ValueError(f"Expected a Keras model. Received: model={type(model).__name__}")
    batch_size = checks.integer("batch_size", batch_size, 1, allow_none=True)
    if task not in TASKS:
        raise ValueError(f"Expected `task` in {TASKS}. Received: task={task!r}")
    if from_logits and (task == "regression" or gaussian_head):
        raise ValueError(
            "`from_logits=True` applies a softmax: it is for classification, not regression. "
            f"Received: task={task!r}, from_logits=True, gaussian_head={gaussian_head}"
        )
    if gaussian_head and task == "classification":
        raise ValueError(
            "A Gaussian head is a regression likelihood. Received: task='classification', gaussian_head=True"
        )
    return batch_size
