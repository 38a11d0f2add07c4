"""Stochastic-gradient MCMC as Keras optimizers: SGLD, SGHMC and cyclical SG-MCMC, trained with ``model.fit``.

The posterior over a network's weights ``theta`` given ``N`` training examples has the
potential ``U(theta) = -sum_i log p(y_i | x_i, theta) - log p(theta) = N L(theta)``, where
``L`` is the loss Keras minimises: the mean negative log-likelihood over a minibatch plus
``-log p(theta) / N`` (the prior, divided by ``N``: pass ``prior_precision`` for a Gaussian
prior ``N(0, 1 / tau)``, or put it in the loss yourself). With a learning rate ``lr``
applied to ``L``'s gradient, as every Keras optimizer does, the samplers are:

* **SGLD** (Welling & Teh 2011, eq. 4), Langevin dynamics with the step ``h = lr / N`` on ``U``::

      theta <- theta - lr grad L(theta) + sqrt(2 lr T / N) xi,        xi ~ N(0, I)

  (``2 h T`` in terms of ``U``'s step: the noise variance of one step is ``2 lr T / N``);
* **SGHMC** (Chen, Fox & Guestrin 2014, eq. 15, the "SGD with momentum" form with the
  gradient-noise estimate ``beta = 0``), with friction ``alpha = 1 - momentum``::

      v     <- (1 - alpha) v - lr grad L(theta) + sqrt(2 alpha lr T / N) xi
      theta <- theta + v

* **cyclical SG-MCMC** (Zhang, Li, Zhang, Chen & Wilson 2020, eq. 1): either sampler with the
  learning rate :class:`CyclicalSchedule`, a cosine that restarts ``cycles`` times in
  ``total_steps`` steps; the first ``exploration`` fraction of each cycle adds no noise (an
  optimizer exploring a new mode), the rest samples.

``T`` is the temperature: ``T = 1`` samples the posterior, ``T < 1`` a cold posterior
``p(theta | D)^(1/T)`` (Wenzel et al. 2020). :class:`SampleCollector` (a callback) keeps
the weights after a burn-in, every ``thin`` steps, in the sampling stages of a cyclical
schedule; its :meth:`SampleCollector.posterior` is an :class:`SGMCMCPosterior`, a
:class:`tfbnn.inference.FittedPosterior` that ``tfbnn.predict``, ``save`` /
:func:`tfbnn.inference.load_posterior` and ``tfbnn.export.export`` read as they read HMC's.

Without a Metropolis correction the chains are biased by ``O(lr)``: for a Gaussian
posterior with precision ``A`` (of ``U``) and full-batch gradients, SGLD's stationary
covariance is ``(A - h A^2 / 2)^-1`` with ``h = lr / N`` (tested exactly); it tends to
``A^-1`` as ``lr -> 0``. Minibatch gradients add their own noise of order ``lr``.

Example:
    >>> import keras, numpy as np, tfbnn
    >>> x = np.random.default_rng(0).normal(size=(64, 2)).astype("float32")
    >>> y = x @ np.float32([[1.0], [-0.5]])
    >>> model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    >>> model.compile(tfbnn.sgmcmc.SGLD(1e-2, num_examples=64, prior_precision=1.0, seed=0), "mse")
    >>> collector = tfbnn.sgmcmc.SampleCollector(burn_in=50, thin=5)
    >>> _ = model.fit(x, y, batch_size=16, epochs=40, verbose=0, callbacks=[collector])
    >>> posterior = collector.posterior()
    >>> posterior.samples.shape[1], tfbnn.predict(posterior, x[:3], num_samples=10).mean.shape
    (3, (3, 1))

References:
    Welling, Teh. Bayesian Learning via Stochastic Gradient Langevin Dynamics. ICML 2011.
    Chen, Fox, Guestrin. Stochastic Gradient Hamiltonian Monte Carlo. ICML 2014.
    Zhang, Li, Zhang, Chen, Wilson. Cyclical Stochastic Gradient MCMC for Bayesian Deep
    Learning. ICLR 2020.
    Wenzel et al. How Good is the Bayes Posterior in Deep Neural Networks Really? ICML 2020.
"""

import math

import keras
import numpy as np
import tensorflow as tf

from tfbnn._internal import checks
from tfbnn.ensembles import DeepEnsemble
from tfbnn.inference import FlatWeights, WeightPosterior

__all__ = ["SGLD", "SGHMC", "CyclicalSchedule", "SampleCollector", "SGMCMCPosterior"]


@keras.saving.register_keras_serializable(package="tfbnn")
class CyclicalSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """The cyclical cosine step size of Zhang et al. (2020), eq. 1, with its exploration stage.

    With ``K = total_steps``, ``M = cycles`` and ``k`` the 0-based step::

        r(k)  = mod(k, ceil(K / M)) / ceil(K / M)
        lr(k) = initial_learning_rate / 2 (cos(pi r(k)) + 1)

    A step with ``r(k) < exploration`` explores (the samplers add no noise); the rest of the
    cycle samples (:meth:`sampling`).

    Args:
        initial_learning_rate: float > 0, ``alpha_0``.
        total_steps: int >= 1, ``K``, the optimizer steps of the whole run.
        cycles: int in ``[1, total_steps]``, ``M``.
        exploration: float in ``[0, 1)``, the fraction ``beta`` of each cycle without noise. Default 0.8.

    Example:
        >>> import numpy as np, tfbnn
        >>> schedule = tfbnn.sgmcmc.CyclicalSchedule(0.1, total_steps=100, cycles=5)   # cycles of 20 steps
        >>> [round(float(schedule(k)), 4) for k in (0, 10, 20)], bool(schedule.sampling(15)), bool(schedule.sampling(16))
        ([0.1, 0.05, 0.1], False, True)
    """

    def __init__(self, initial_learning_rate, total_steps, cycles, exploration=0.8):
        self.initial_learning_rate = checks.number("initial_learning_rate", initial_learning_rate, 0.0,
                                                   low_open=True)
        self.total_steps = checks.integer("total_steps", total_steps, 1)
        self.cycles = checks.integer("cycles", cycles, 1, self.total_steps)
        self.exploration = checks.number("exploration", exploration, 0.0, 1.0, high_open=True)
        self.cycle_length = math.ceil(self.total_steps / self.cycles)
        # The first step of each cycle's sampling stage, as `sampling` computes it (float32 positions).
        positions = np.arange(self.cycle_length, dtype=np.float32) / np.float32(self.cycle_length)
        self.sampling_start = int(np.argmax(positions >= np.float32(self.exploration)))

    def _position(self, step):
        step = tf.cast(step, tf.float32)
        return tf.math.floormod(step, float(self.cycle_length)) / float(self.cycle_length)

    def __call__(self, step):
        # alpha_0 / 2 (cos(pi r) + 1) = alpha_0 cos^2(pi r / 2), without the cancellation near r = 1.
        return self.initial_learning_rate * tf.square(tf.cos(0.5 * math.pi * self._position(step)))

    def sampling(self, step):
        """Whether step ``step`` (0-based) is in a sampling stage: a boolean tensor."""
        return self._position(step) >= self.exploration

    def get_config(self):
        return {"initial_learning_rate": self.initial_learning_rate, "total_steps": self.total_steps,
                "cycles": self.cycles, "exploration": self.exploration}


class _Sampler(keras.optimizers.Optimizer):
    """Shared arguments of the SG-MCMC optimizers: dataset size, temperature, Gaussian prior, seed."""

    def __init__(self, learning_rate, num_examples, temperature=1.0, prior_precision=None, seed=None, name=None,
                 **kwargs):
        super().__init__(learning_rate=learning_rate, name=name, **kwargs)
        #: The :class:`CyclicalSchedule` when the learning rate is one (its stages switch the noise), else None.
        self.schedule = learning_rate if isinstance(learning_rate, CyclicalSchedule) else None
        self.num_examples = checks.integer("num_examples", num_examples, 1)
        self.temperature = checks.number("temperature", temperature, 0.0)
        self.prior_precision = checks.number("prior_precision", prior_precision, 0.0, allow_none=True)
        if seed is not None:
            seed = checks.integer("seed", seed, 0)
        self.seed = seed
        self._seed_generator = keras.random.SeedGenerator(seed, name="sgmcmc_seed")

    def _gradient(self, gradient, variable):
        """``grad L`` with the Gaussian prior's ``tau theta / N`` added when ``prior_precision`` is set."""
        gradient = tf.cast(gradient, variable.dtype)
        if self.prior_precision:
            gradient = gradient + (self.prior_precision / self.num_examples) * variable
        return gradient

    def _noise(self, variable, variance):
        """``N(0, variance)`` noise shaped like ``variable``, off in a cyclical schedule's exploration stage."""
        noise = keras.random.normal(variable.shape, dtype=variable.dtype, seed=self._seed_generator)
        scale = tf.sqrt(tf.cast(variance, variable.dtype))
        if self.schedule is not None:
            scale *= tf.cast(self.schedule.sampling(self.iterations), variable.dtype)
        return scale * noise

    def get_config(self):
        config = super().get_config()
        config.update({"num_examples": self.num_examples, "temperature": self.temperature,
                       "prior_precision": self.prior_precision, "seed": self.seed})
        return config


@keras.saving.register_keras_serializable(package="tfbnn")
class SGLD(_Sampler):
    """Stochastic gradient Langevin dynamics (Welling & Teh 2011) as a Keras optimizer.

    ``theta <- theta - lr grad L + sqrt(2 lr T / N) xi`` with ``L`` the Keras loss (mean
    NLL per example, prior over ``N``); see the module docstring for the scaling.

    Args:
        learning_rate: float or a schedule (:class:`CyclicalSchedule` for cyclical SGLD), on ``L``'s gradient.
        num_examples: int >= 1, ``N``, the training set's size.
        temperature: float >= 0, ``T`` (1: the posterior; below 1: a cold posterior; 0: SGD).
        prior_precision: float >= 0 or None: a Gaussian prior ``N(0, 1 / tau)`` on every
            trained weight, its gradient ``tau theta / N`` added; None (default): the loss holds the prior.
        seed: int >= 0 or None, the seed of the noise.
        **kwargs: Keras optimizer arguments (``name``, ``clipnorm``...).

    Example:
        >>> import tfbnn
        >>> opt = tfbnn.sgmcmc.SGLD(1e-3, num_examples=50_000, temperature=1.0, seed=0)
        >>> opt.num_examples, opt.temperature
        (50000, 1.0)
    """

    def update_step(self, gradient, variable, learning_rate):
        lr = tf.cast(learning_rate, variable.dtype)
        step = -lr * self._gradient(gradient, variable)
        step += self._noise(variable, 2.0 * lr * self.temperature / self.num_examples)
        self.assign_add(variable, step)


@keras.saving.register_keras_serializable(package="tfbnn")
class SGHMC(_Sampler):
    """Stochastic gradient Hamiltonian Monte Carlo (Chen, Fox & Guestrin 2014, eq. 15) as a Keras optimizer.

    ``v <- (1 - alpha) v - lr grad L + sqrt(2 alpha lr T / N) xi``, ``theta <- theta + v``,
    with ``alpha = 1 - momentum`` the friction (the gradient-noise estimate taken as 0).

    Args:
        learning_rate, num_examples, temperature, prior_precision, seed: as :class:`SGLD`.
        momentum: float in ``[0, 1)``, ``1 - alpha``. Default 0.9 (Zhang et al. 2020's
            ``alpha = 0.1``).
        **kwargs: Keras optimizer arguments.

    Example:
        >>> import tfbnn
        >>> opt = tfbnn.sgmcmc.SGHMC(tfbnn.sgmcmc.CyclicalSchedule(0.05, 1000, 4), num_examples=1000, seed=0)
        >>> opt.momentum
        0.9
    """

    def __init__(self, learning_rate, num_examples, momentum=0.9, temperature=1.0, prior_precision=None, seed=None,
                 name=None, **kwargs):
        super().__init__(learning_rate, num_examples, temperature, prior_precision, seed, name, **kwargs)
        self.momentum = checks.number("momentum", momentum, 0.0, 1.0, high_open=True)

    def build(self, variables):
        if self.built:
            return
        super().build(variables)
        self.velocities = self.add_optimizer_variables(variables, "velocity")

    def update_step(self, gradient, variable, learning_rate):
        lr = tf.cast(learning_rate, variable.dtype)
        friction = 1.0 - self.momentum
        velocity = self.velocities[self._get_variable_index(variable)]
        new = (self.momentum * velocity - lr * self._gradient(gradient, variable)
               + self._noise(variable, 2.0 * friction * lr * self.temperature / self.num_examples))
        self.assign(velocity, new)
        self.assign_add(variable, new)

    def get_config(self):
        config = super().get_config()
        config["momentum"] = self.momentum
        return config


class SGMCMCPosterior(WeightPosterior):
    """Weight samples collected from an SG-MCMC run: a fitted posterior like :class:`tfbnn.hmc.HMCResult`.

    Attributes:
        model: the ``keras.Model`` the weights belong to.
        samples: ``(S, P)`` float64 weight samples, ordered as the flattened ``model.trainable_variables``.
        steps: ``(S,)`` the optimizer step at which each was kept.
    """

    kind = "sgmcmc"

    def __init__(self, model, samples, steps=None):
        self.model = model
        self.samples = np.asarray(samples, np.float64)
        if self.samples.ndim != 2 or len(self.samples) == 0:
            raise ValueError(f"Expected `samples` of shape (S >= 1, P). Received: samples of shape {self.samples.shape}")
        size = FlatWeights(model).num_parameters
        if self.samples.shape[1] != size:
            raise ValueError(f"Expected `samples` with the model's {size} trainable weights per row. Received: "
                             f"samples of shape {self.samples.shape}")
        self.steps = np.arange(len(self.samples)) if steps is None else np.asarray(steps, np.int64)

    def weight_draws(self, num_samples, seed=None):
        """``num_samples`` samples evenly spaced through the collected ones (no randomness; ``seed`` unused)."""
        num_samples = checks.integer("num_samples", num_samples, 1, len(self.samples))
        return self.samples[np.round(np.linspace(0, len(self.samples) - 1, num_samples)).astype(int)]

    def mean(self):
        """The samples' mean ``(P,)``."""
        return self.samples.mean(0)

    def to_ensemble(self, vectorize="stacked", name=None):
        """The samples as a :class:`tfbnn.DeepEnsemble`: one copy of the network per sample.

        The SG-MCMC predictive is the Bayesian model average over the samples,
        ``p(y | x) = (1 / S) sum_s p(y | x, theta_s)``, which is the uniform mixture of a
        deep ensemble whose members hold the samples' weights: ``tfbnn.predict`` of the
        ensemble equals ``tfbnn.predict(posterior, x, num_samples=S)``, and the ensemble saves as
        ``.keras`` and exports like any Keras model (what :func:`tfbnn.training.run` keeps of a
        ``csgmcmc`` run).

        Args:
            vectorize: the ensemble's ``vectorize`` (``"stacked"``: one batched forward pass).
            name: the ensemble's name (default ``"sgmcmc_<model name>"``).

        Returns:
            A :class:`tfbnn.DeepEnsemble` of ``S`` members (uncompiled copies of the model's
            architecture, each with its sample's trainable weights and the model's non-trainable state).
        """
        flat = FlatWeights(self.model)
        weights = self.model.get_weights()
        members = []
        for theta in self.samples:
            # From the architecture's config: keras.models.clone_model would also copy the compile state
            # (a loss function of the user's that is not registered for serialization fails there).
            member = type(self.model).from_config(self.model.get_config())
            if not member.built:
                member.build(self.model.input_shape)
            member.set_weights(weights)
            flat.assign(theta, member)
            members.append(member)
        return DeepEnsemble(members, vectorize=vectorize, name=name or f"sgmcmc_{self.model.name}")

    def _state(self):
        return {}, {"samples": self.samples, "steps": self.steps}

    @classmethod
    def _from_state(cls, config, arrays, model):
        return cls(model, arrays["samples"], arrays["steps"])


class SampleCollector(keras.callbacks.Callback):
    """Keeps the model's weights during ``fit`` as posterior samples: after ``burn_in`` optimizer steps, at
    least ``thin`` steps apart, and, with a :class:`CyclicalSchedule`, in its sampling stages only.

    Checked at the end of every batch (every ``steps_per_execution`` steps when that is
    above 1: the steps between two kept samples are then at least that many).

    With ``per_cycle=n`` and a :class:`CyclicalSchedule`, it keeps ``n`` samples per cycle, the
    last step of the cycle and the steps ``d, 2d, ...`` before it, with ``d = max(1, floor(L_s / n))``
    and ``L_s`` the sampling stage's length in steps (Zhang et al. 2020 collect a few samples at the
    end of each cycle, where the step size is smallest); ``burn_in`` and ``thin`` still apply. A
    cycle the run cuts short (``total_steps`` not a multiple of ``cycles``) may keep fewer.

    Args:
        burn_in: int >= 0, optimizer steps discarded first. Default 0.
        thin: int >= 1, the least number of steps between two kept samples. Default 1.
        max_samples: int >= 1 or None: keep at most this many (the latest). Default None.
        per_cycle: int >= 1 or None: the samples kept per cycle of the optimizer's
            :class:`CyclicalSchedule` (an error at the start of ``fit`` without one). Default None:
            every step the other rules allow.

    Attributes:
        samples: the list of kept ``(P,)`` float64 weight vectors; ``steps`` their steps.

    Example:
        >>> import tfbnn
        >>> tfbnn.sgmcmc.SampleCollector(burn_in=1000, thin=10).thin
        10
    """

    def __init__(self, burn_in=0, thin=1, max_samples=None, per_cycle=None):
        super().__init__()
        self.burn_in = checks.integer("burn_in", burn_in, 0)
        self.thin = checks.integer("thin", thin, 1)
        self.max_samples = checks.integer("max_samples", max_samples, 1, allow_none=True)
        self.per_cycle = checks.integer("per_cycle", per_cycle, 1, allow_none=True)
        self.samples, self.steps = [], []
        self._flat = None

    def on_train_begin(self, logs=None):
        if self.per_cycle is not None and not isinstance(getattr(self.model.optimizer, "schedule", None),
                                                         CyclicalSchedule):
            raise ValueError("`per_cycle` needs an optimizer of tfbnn.sgmcmc with a CyclicalSchedule learning rate. "
                             f"Received: per_cycle={self.per_cycle}, optimizer "
                             f"{type(self.model.optimizer).__name__}")

    def keeps_in_cycle(self, schedule, step):
        """Whether ``per_cycle`` keeps the weights after the 0-based optimizer step ``step`` of ``schedule``."""
        length, first = schedule.cycle_length, schedule.sampling_start
        spacing = max(1, (length - first) // self.per_cycle)
        back = length - 1 - step % length  # steps before the cycle's last one
        return back % spacing == 0 and back // spacing < self.per_cycle and step % length >= first

    def on_train_batch_end(self, batch, logs=None):
        optimizer = self.model.optimizer
        step = int(optimizer.iterations.numpy())  # steps taken; the last one was step - 1
        if step <= self.burn_in or (self.steps and step - self.steps[-1] < self.thin):
            return
        schedule = getattr(optimizer, "schedule", None)
        if isinstance(schedule, CyclicalSchedule) and not bool(schedule.sampling(step - 1)):
            return
        if self.per_cycle is not None and not self.keeps_in_cycle(schedule, step - 1):
            return
        if self._flat is None or self._flat.model is not self.model:
            self._flat = FlatWeights(self.model)
        self.samples.append(self._flat.flatten())
        self.steps.append(step)
        if self.max_samples is not None and len(self.samples) > self.max_samples:
            del self.samples[0], self.steps[0]

    def posterior(self, model=None):
        """The kept samples as an :class:`SGMCMCPosterior` of ``model`` (default: the model trained)."""
        if not self.samples:
            raise ValueError("No samples were kept: train longer than `burn_in`, or in a cyclical schedule's "
                             f"sampling stage. Received: burn_in={self.burn_in}, thin={self.thin}")
        return SGMCMCPosterior(model or self.model, np.stack(self.samples), np.asarray(self.steps))
