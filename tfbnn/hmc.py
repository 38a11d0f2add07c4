"""Hamiltonian Monte Carlo over all weights of a small Keras model: the reference posterior.

For a model ``f(x; theta)`` with P weights (flattened in the order of
``model.trainable_variables``), the prior ``theta ~ N(0, prior_scale^2 I)`` and a
likelihood, :func:`sample` draws from the exact posterior::

    log p(theta | D) = sum_n log p(y_n | f(x_n; theta)) + log N(theta; 0, prior_scale^2 I) + const

    normal:       p(y | f) = N(y; f, sigma^2)          (sigma known, or sampled: log sigma ~ N(0, 1))
    categorical:  p(y | f) = softmax(f)_y              (f the logits: a softmax output layer is
                                                        run as linear)

with ``tfp.mcmc``: Hamiltonian Monte Carlo (Neal 2011; a fixed number of leapfrog
steps) or the No-U-Turn sampler (Hoffman & Gelman 2014, Algorithm 6 with dual
averaging), the step size tuned during burn-in by dual averaging (Hoffman & Gelman
2014, sec. 3.2; ``tfp.mcmc.DualAveragingStepSizeAdaptation``) to ``target_accept``.
Several chains run as one vectorized computation: the log density of ``(C, P)``
weights evaluates the network for the C weight vectors at once
(``keras.Layer.stateless_call`` vectorized over chains), compiled with XLA.

Diagnostics (``tfp.mcmc``): the split-free potential scale reduction R-hat across
chains (Gelman & Rubin 1992; ``potential_scale_reduction``), near 1 when the chains
agree, and the effective sample size over all chains (``effective_sample_size`` with
``cross_chain_dims``; Vehtari et al. 2021 for the cross-chain form). Use them: an
R-hat above about 1.01-1.1 or a small ESS means the draws are not yet a posterior
sample (multimodality is common for neural networks; more chains, longer runs).

The result is a :class:`tfbnn.inference.WeightPosterior`: ``tfbnn.predict(result, x,
num_samples=T)`` runs the model with T draws pooled over chains (evenly spaced
through the draws); :meth:`HMCResult.predictive` uses them all.

Example:
    >>> import keras, numpy as np, tfbnn
    >>> rng = np.random.default_rng(0)
    >>> x = rng.normal(size=(20, 1)).astype("float32")
    >>> y = 2 * x + 0.5 * rng.normal(size=(20, 1)).astype("float32")
    >>> model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
    >>> res = tfbnn.hmc.sample(model, x, y, noise_scale=0.5, num_chains=2, num_results=100,
    ...                        num_burnin=100, jit_compile=False)
    >>> res.samples.shape                                   # (chains, draws, P)
    (2, 100, 2)
    >>> bool(abs(res.samples[..., 0].mean() - 2) < 0.5), bool(np.all(res.r_hat < 1.2))
    (True, True)
    >>> tfbnn.predict(res, x[:3], num_samples=50).aleatoric_std.ravel().tolist()
    [0.5, 0.5, 0.5]

References:
    Neal. MCMC Using Hamiltonian Dynamics. Handbook of Markov Chain Monte Carlo, 2011.
    Hoffman, Gelman. The No-U-Turn Sampler. JMLR 15, 2014.
    Gelman, Rubin. Inference from Iterative Simulation Using Multiple Sequences.
    Statistical Science 7(4), 1992.
    Vehtari, Gelman, Simpson, Carpenter, Burkner. Rank-Normalization, Folding, and
    Localization: An Improved R-hat. Bayesian Analysis 16(2), 2021.
    Izmailov, Vikram, Hoffman, Wilson. What Are Bayesian Neural Network Posteriors
    Really Like? ICML 2021 (HMC as the reference for BNNs).
"""

import dataclasses
import time

import keras
import numpy as np
import tensorflow as tf
import tensorflow_probability as tfp

from tfbnn._internal import checks
from tfbnn.inference import FlatWeights, WeightPosterior, predict
from tfbnn.utils import stochastic_layers

__all__ = ["sample", "HMCResult", "LIKELIHOODS", "KERNELS", "INITS"]

LIKELIHOODS = ("normal", "categorical")
KERNELS = ("hmc", "nuts")
INITS = ("model", "prior")
#: The largest number of weights :func:`sample` accepts.
MAX_PARAMETERS = 10_000


def _choice(name, value, options):
    if not isinstance(value, str) or value not in options:
        raise ValueError(f"Expected `{name}` in {options}. Received: {name}={value!r}")
    return value


@dataclasses.dataclass(eq=False)
class HMCResult(WeightPosterior):
    """Posterior draws of a model's flattened weights, and the sampler's diagnostics.

    Attributes:
        model: the ``keras.Model`` the weights belong to (its own weights are unchanged).
        samples: ``(chains, draws, P)`` float64 weight draws, ordered as the flattened
            ``model.trainable_variables``.
        noise: ``(chains, draws)`` float64 noise stds when sampled, else None.
        likelihood: ``"normal"`` or ``"categorical"``.
        noise_scale: the known noise std (``"normal"``), or None.
        r_hat: ``(P,)`` (``(P + 1,)`` with a sampled noise, ``log sigma`` last): R-hat per
            coordinate across chains (NaN for one chain).
        ess: the same shape: effective sample size per coordinate, all chains together.
        acceptance_rate: ``(chains,)``, the mean acceptance probability ``min(1, exp(log
            accept ratio))`` after burn-in (for NUTS, TFP's average over the tree).
        step_size: float, the adapted leapfrog step size.
        seconds: float, the wall time of sampling (tracing and compiling included).
        kernel: ``"hmc"`` or ``"nuts"``.
    """

    model: keras.Model
    samples: np.ndarray
    noise: np.ndarray
    likelihood: str
    noise_scale: float
    r_hat: np.ndarray
    ess: np.ndarray
    acceptance_rate: np.ndarray
    step_size: float
    seconds: float
    kernel: str

    @property
    def num_draws(self):
        """Draws over all chains."""
        return self.samples.shape[0] * self.samples.shape[1]

    def _pooled_indices(self, num_samples):
        if num_samples > self.num_draws:
            raise ValueError(f"Expected num_samples <= the {self.num_draws} draws of this HMC run. "
                             f"Received: num_samples={num_samples}")
        return np.round(np.linspace(0, self.num_draws - 1, num_samples)).astype(int)

    def pooled(self):
        """All draws ``(chains * draws, P)``, draw-major (the chains interleaved)."""
        return self.samples.transpose(1, 0, 2).reshape(self.num_draws, -1)

    kind = "hmc"

    def weight_draws(self, num_samples, seed=None):
        """``num_samples`` draws evenly spaced through the pooled draws; no randomness (``seed`` is unused)."""
        return self.pooled()[self._pooled_indices(num_samples)]

    def noise_scales(self, num_samples):
        if self.likelihood != "normal":
            return None
        if self.noise is None:
            return np.full(num_samples, self.noise_scale)
        return self.noise.T.reshape(-1)[self._pooled_indices(num_samples)]

    def predictive(self, x, batch_size=None, return_samples=False):
        """``tfbnn.predict`` with every draw: a :class:`tfbnn.RegressionPrediction` (with the noise
        as the aleatoric part) or a :class:`tfbnn.ClassificationPrediction`."""
        return predict(self, x, num_samples=self.num_draws, batch_size=batch_size, return_samples=return_samples)

    def r_hat_outputs(self, x, batch_size=None):
        """R-hat of the network's outputs at ``x`` across chains, ``(N, ...)``.

        Weight-space R-hat of a neural network stays above 1 whenever the chains sit in
        different but equivalent modes (hidden units permuted); the outputs are what the
        predictive uses, and their R-hat near 1 says the chains agree on the function.
        """
        chains, draws = self.samples.shape[:2]
        outputs = self._output_samples(self.pooled(), x, batch_size)  # (draws * chains, N, ...) draw-major
        outputs = outputs.reshape((draws, chains) + outputs.shape[1:])
        if chains < 2:
            return np.full(outputs.shape[2:], np.nan)
        return np.asarray(tfp.mcmc.potential_scale_reduction(tf.constant(outputs, tf.float64), independent_chain_ndims=1))

    def _state(self):
        config = {"likelihood": self.likelihood, "noise_scale": self.noise_scale, "step_size": self.step_size,
                  "seconds": self.seconds, "kernel": self.kernel}
        arrays = {"samples": self.samples, "r_hat": self.r_hat, "ess": self.ess,
                  "acceptance_rate": self.acceptance_rate}
        return config, arrays if self.noise is None else dict(arrays, noise=self.noise)

    @classmethod
    def _from_state(cls, config, arrays, model):
        size = FlatWeights(model).num_parameters
        if arrays["samples"].shape[-1] != size:
            raise ValueError(f"Expected a model with {arrays['samples'].shape[-1]} trainable weights (the saved "
                             f"draws'). Received: model={model.name!r} with {size}")
        return cls(model=model, noise=arrays.get("noise"), **config,
                   **{k: v for k, v in arrays.items() if k != "noise"})

    def summary(self):
        """One line: R-hat's maximum, the smallest ESS, acceptance and time."""
        return (f"{self.kernel}: {self.samples.shape[0]} chains x {self.samples.shape[1]} draws, "
                f"max R-hat {np.nanmax(self.r_hat):.3f}, min ESS {np.min(self.ess):.0f}, "
                f"acceptance {np.mean(self.acceptance_rate):.2f}, step size {self.step_size:.2e}, "
                f"{self.seconds:.1f} s")


def _log_likelihood(flat, likelihood, x, y, noise_scale):
    """``(C, Q) -> (C,)``: the log-likelihood of the data for each chain's state."""
    size = flat.num_parameters

    def log_likelihood(state):
        f = flat.forward(state[:, :size], x)
        if likelihood == "categorical":
            labels = tf.broadcast_to(y, tf.shape(f)[:-1])
            return -tf.reduce_sum(tf.nn.sparse_softmax_cross_entropy_with_logits(labels, f), axis=1)
        sigma = noise_scale if noise_scale is not None else tf.exp(state[:, size])[:, None, None]
        log_prob = -0.5 * tf.square((y - f) / sigma) - tf.math.log(sigma) - 0.5 * np.log(2 * np.pi)
        return tf.reduce_sum(tf.broadcast_to(log_prob, tf.shape(f)), axis=[1, 2])

    return log_likelihood


def _check_deterministic(model):
    """HMC needs a target that is a function of the weights: no layer may draw noise at inference."""
    noisy = [layer.name for layer in stochastic_layers(model) if layer.inference_mode == "sample"]
    if noisy:
        raise ValueError(
            "Expected `model` to be deterministic at inference: HMC's log density must be a function of the "
            "weights, but layers that sample (Flipout's per-example sign noise, reparameterization, MC dropout) "
            "make it random. Sample a deterministic network, or switch the layers to their posterior mean with "
            f"`tfbnn.set_inference_mode(model, 'mean')`. Received: model={model.name!r} with sampling layers {noisy}")


def _check_data(flat, x, y, likelihood):
    x = checks.finite_array("x", x, keras.config.floatx())
    y = checks.finite_array("y", y)
    if len(x) == 0 or len(y) != len(x):
        raise ValueError(f"Expected as many targets as inputs (at least one). Received: x of shape {x.shape}, "
                         f"y of shape {y.shape}")
    out = flat.network(x[:1], training=False)
    if likelihood == "categorical":
        labels = y.reshape(len(y))
        classes = out.shape[-1]
        if not np.issubdtype(labels.dtype, np.integer) or labels.min() < 0 or labels.max() >= classes:
            raise ValueError(f"Expected integer labels in [0, {classes}) for likelihood='categorical'. Received: "
                             f"y of dtype {y.dtype} in [{labels.min()}, {labels.max()}]")
        return x, labels.astype("int32")
    y = y.astype(keras.config.floatx()).reshape((len(y),) + tuple(out.shape[1:]))
    return x, y


def sample(model, x, y, likelihood="normal", prior_scale=1.0, noise_scale=None, num_chains=4, num_results=500,
           num_burnin=500, step_size=0.01, target_accept=0.75, kernel="nuts", num_leapfrog_steps=20,
           max_tree_depth=8, init="model", init_scale=0.1, jit_compile=True, seed=0):
    """Samples the posterior over all trainable weights of ``model`` with HMC or NUTS.

    The log density is the module docstring's, over the full data (no minibatches). The
    step size adapts by dual averaging over the first 80% of burn-in, to a mean
    acceptance of ``target_accept``; the chains share it.

    Args:
        model: a built Sequential or functional ``keras.Model`` with at most 10,000
            trainable weights, one output ``(batch, K)``: regression means, or class
            logits or a softmax ``Dense`` (run as logits). Its weights are not changed.
            It must be deterministic at inference: a layer that samples (Flipout,
            reparameterization, MC dropout in ``inference_mode="sample"``) is refused.
        x: inputs ``(N, ...)`` (finite arrays; the full data set is one batch).
        y: finite targets ``(N, K)`` or ``(N,)`` (regression), integer labels ``(N,)`` (categorical).
        likelihood: ``"normal"`` (default) or ``"categorical"``.
        prior_scale: float > 0, the std of the ``N(0, prior_scale^2)`` prior on every
            weight. Default 1.
        noise_scale: float > 0 or None (``"normal"`` only): the known noise std, or None to
            sample ``log sigma`` too (prior ``N(0, 1)``).
        num_chains: int >= 1. Default 4 (R-hat needs at least 2).
        num_results: int >= 1, draws kept per chain. Default 500.
        num_burnin: int >= 0, steps per chain before the draws (step-size adaptation). Default 500.
        step_size: float > 0, the initial leapfrog step size. Default 0.01.
        target_accept: float in (0, 1), the acceptance rate dual averaging aims at.
            Default 0.75 (0.6-0.8 suits HMC; NUTS is often run at 0.8 or more).
        kernel: ``"nuts"`` (default) or ``"hmc"``. HMC's fixed trajectory length
            ``num_leapfrog_steps * step_size`` can resonate with the posterior: near half
            a period of a Gaussian direction (``pi`` times its std) each proposal
            reflects the state, the draws anticorrelate and the chains disagree (R-hat
            well above 1 on the conjugate test with 5 steps). NUTS chooses the length
            per step; prefer it unless its cost matters, and check R-hat either way.
        num_leapfrog_steps: int >= 1, leapfrog steps per HMC proposal. Default 20.
        max_tree_depth: int >= 1, NUTS's largest tree (up to ``2^depth - 1`` leapfrog
            steps). Default 8.
        init: ``"model"`` (default): every chain starts at the model's weights plus
            ``N(0, init_scale^2)`` jitter (start from a trained network to shorten
            burn-in); ``"prior"``: chains start at prior draws (overdispersed, better
            for R-hat, longer burn-in).
        init_scale: float >= 0, the jitter of ``init="model"``. Default 0.1.
        jit_compile: bool, compile the sampler with XLA. Default True (about 5-10x faster
            on CPU for small MLPs, after about 10 s of compiling).
        seed: int in ``[0, 2^31)``, the seed of the initial jitter and of the sampler (stateless).
            Default 0.

    Returns:
        An :class:`HMCResult`.
    """
    likelihood = _choice("likelihood", likelihood, LIKELIHOODS)
    kernel = _choice("kernel", kernel, KERNELS)
    init = _choice("init", init, INITS)
    prior_scale = checks.number("prior_scale", prior_scale, low=0, low_open=True)
    if noise_scale is not None:
        if likelihood != "normal":
            raise ValueError(f"`noise_scale` is the std of a normal likelihood. Received: likelihood={likelihood!r}, "
                             f"noise_scale={noise_scale!r}")
        noise_scale = checks.number("noise_scale", noise_scale, low=0, low_open=True)
    num_chains = checks.integer("num_chains", num_chains, 1)
    num_results = checks.integer("num_results", num_results, 1)
    num_burnin = checks.integer("num_burnin", num_burnin, 0)
    step_size = checks.number("step_size", step_size, low=0, low_open=True)
    target_accept = checks.number("target_accept", target_accept, low=0, high=1, low_open=True, high_open=True)
    num_leapfrog_steps = checks.integer("num_leapfrog_steps", num_leapfrog_steps, 1)
    max_tree_depth = checks.integer("max_tree_depth", max_tree_depth, 1)
    init_scale = checks.number("init_scale", init_scale, low=0)
    seed = checks.numpy_seed(seed, allow_none=False)
    flat = FlatWeights(model, logits=likelihood == "categorical")
    _check_deterministic(model)
    if flat.num_parameters > MAX_PARAMETERS:
        raise ValueError(f"Expected a model with at most {MAX_PARAMETERS} trainable weights for HMC. "
                         f"Received: model={model.name!r} with {flat.num_parameters}")
    x, y = _check_data(flat, x, y, likelihood)
    learn_noise = likelihood == "normal" and noise_scale is None
    state = _initial_state(flat, model, x, y, init, init_scale, prior_scale, num_chains, learn_noise, seed)
    log_likelihood = _log_likelihood(flat, likelihood, tf.constant(x), tf.constant(y), noise_scale)
    size = flat.num_parameters

    def log_prob(state):
        prior = -0.5 * tf.reduce_sum(tf.square(state[:, :size] / prior_scale), axis=-1)
        if learn_noise:
            prior += -0.5 * tf.square(state[:, size])
        return log_likelihood(state) + prior

    if kernel == "hmc":
        inner = tfp.mcmc.HamiltonianMonteCarlo(log_prob, step_size=step_size, num_leapfrog_steps=num_leapfrog_steps)
    else:
        inner = tfp.mcmc.NoUTurnSampler(log_prob, step_size=step_size, max_tree_depth=max_tree_depth)
    adaptive = tfp.mcmc.DualAveragingStepSizeAdaptation(
        inner, num_adaptation_steps=int(0.8 * num_burnin), target_accept_prob=tf.cast(target_accept, flat.dtype))

    @tf.function(jit_compile=jit_compile)
    def run(initial, seed_tensor):
        return tfp.mcmc.sample_chain(
            num_results, initial, kernel=adaptive, num_burnin_steps=num_burnin, seed=seed_tensor,
            trace_fn=lambda _, results: (tf.exp(tf.minimum(results.inner_results.log_accept_ratio, 0.0)),
                                         results.new_step_size))

    start = time.perf_counter()
    draws, (accepted, step_sizes) = run(tf.constant(state, flat.dtype), tf.constant([seed, 1], tf.int32))
    r_hat, ess = _diagnostics(draws, num_chains)
    seconds = time.perf_counter() - start
    draws = np.asarray(draws, np.float64).transpose(1, 0, 2)  # (chains, draws, Q)
    return HMCResult(
        model=model, samples=draws[..., :size], noise=np.exp(draws[..., size]) if learn_noise else None,
        likelihood=likelihood, noise_scale=noise_scale, r_hat=r_hat, ess=ess,
        acceptance_rate=np.asarray(accepted, np.float64).mean(axis=0),
        step_size=float(np.asarray(step_sizes)[-1]), seconds=seconds, kernel=kernel)


def _initial_state(flat, model, x, y, init, init_scale, prior_scale, num_chains, learn_noise, seed):
    rng = np.random.default_rng(seed)
    if init == "model":
        state = flat.flatten() + init_scale * rng.standard_normal((num_chains, flat.num_parameters))
    else:
        state = prior_scale * rng.standard_normal((num_chains, flat.num_parameters))
    if not learn_noise:
        return state
    residual = np.asarray(model(x, training=False), np.float64) - y
    log_sigma = np.log(max(float(np.std(residual)), 1e-3))
    return np.concatenate([state, np.full((num_chains, 1), log_sigma)], axis=1)


def _diagnostics(draws, num_chains):
    """R-hat and ESS per coordinate of ``draws`` (draws, chains, Q)."""
    draws = tf.cast(draws, tf.float64)
    if num_chains < 2:
        ess = tfp.mcmc.effective_sample_size(draws[:, 0])
        return np.full(draws.shape[-1], np.nan), np.asarray(ess)
    r_hat = tfp.mcmc.potential_scale_reduction(draws, independent_chain_ndims=1)
    ess = tfp.mcmc.effective_sample_size(draws, cross_chain_dims=1)
    return np.asarray(r_hat), np.asarray(ess)
