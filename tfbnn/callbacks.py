"""Training callbacks. The ELBO convention of tfbnn is stated here once.

The ELBO convention
-------------------
Keras reduces the data loss to a mean over the minibatch. tfbnn layers add
``kl_weight * KL(q || p)`` to ``model.losses``. With ``N`` training examples the
per-example negative ELBO (Blundell et al. 2015, eq. 1-2, divided by N) is::

    loss = mean_batch NLL  +  beta * KL(q || p) / N

so every Bayesian layer holds ``kl_weight = beta / N``. ``beta = 1`` is the true
ELBO; schedules move it (annealing, warm-up, Blundell's minibatch weights, see
:mod:`tfbnn.schedules`). :class:`KLAnnealing` owns ``beta`` and writes ``beta / N``
into each layer's non-trainable ``kl_weight`` variable before every batch, so the
change takes effect inside the compiled train step.

Tempered ("cold") posteriors: beta < 1
--------------------------------------
A final ``beta < 1`` is not the ELBO but a tempered one. Multiplying the loss by
``N / beta``::

    (N / beta) * loss = (1 / beta) * sum_i NLL_i  +  KL(q || p)

which is the negative ELBO of a data set holding every example ``1 / beta`` times
(``beta = 0.1``: ten copies), or equally of the prior's weight cut to ``beta``
against the data. Over all ``q`` its optimum is the likelihood-tempered posterior
``p_beta(w | D) = p(D | w)^(1/beta) p(w) / Z``: a "cold" posterior, sharper than
the Bayes posterior, that tends to the maximum-likelihood point as ``beta -> 0``
(``beta`` is Wenzel et al.'s temperature ``T`` with the likelihood tempered and the
prior not; with a Normal prior ``N(0, s^2)`` their fully tempered posterior
``exp(-U(w) / T)``, ``U = -sum_i log p(y_i | x_i, w) - log p(w)``, is this one with
the prior ``N(0, T s^2)``). Variational BNNs down-weight the KL this way in
practice (Zhang et al. 2018, noisy natural gradient, KL weight ``lambda``; Osawa
et al. 2019, VOGN, ``tau``), and Wenzel et al. (2020) find cold posteriors predict
better than the Bayes posterior in deep networks.

The trade-off. On little data the ``beta = 1`` mean-field posterior is wide: its
samples disagree, so the Monte Carlo predictive is under-confident (its mean
confidence below its accuracy) and less accurate than a deterministic network.
A smaller ``beta`` narrows it: accuracy, NLL and calibration usually improve,
but the epistemic uncertainty (mutual information) shrinks with it, so the
model says less about inputs it has not seen, and the result is no longer the
Bayes posterior of the stated prior (``beta`` is a hyper-parameter: choose it on
validation data). Post-hoc temperature scaling of the predictive
(:meth:`tfbnn.TemperatureScaling.fit_prediction`) fixes the calibration of a
``beta = 1`` model without retraining, but not its accuracy.

References:
    Blundell, Cornebise, Kavukcuoglu, Wierstra. Weight Uncertainty in Neural
    Networks. ICML 2015 (eq. 1-2, 9).
    Wenzel et al. How Good is the Bayes Posterior in Deep Neural Networks Really?
    ICML 2020 (sec. 2, the tempered posterior).
    Zhang, Sun, Duvenaud, Grosse. Noisy Natural Gradient as Variational Inference.
    ICML 2018.
    Osawa et al. Practical Deep Learning with Bayesian Principles. NeurIPS 2019.
"""

import math
import os
import time
import warnings

import keras
import numpy as np
import tensorflow as tf

from tfbnn import distribute, metrics, pruning
from tfbnn._internal import checks, keras_private
from tfbnn import schedules as schedules_lib
from tfbnn.inference import predict
from tfbnn.utils import bayesian_layers, set_kl_weight

__all__ = ["KLAnnealing", "SparsityMonitor", "NaNGuard", "EpochTimer", "PosteriorBoard"]


class KLAnnealing(keras.callbacks.Callback):
    """Sets ``kl_weight = beta / N`` on every Bayesian layer before each batch.

    ``beta`` follows ``schedule(epoch, batch, steps_per_epoch)`` (a pure function of
    the position in training), so after an interruption
    ``keras.callbacks.BackupAndRestore`` resumes with the same beta the
    uninterrupted run would have had. The current beta is logged as ``kl_beta``
    (progress bar per batch, ``History`` per epoch: the value at the epoch's last
    batch).

    ``beta`` ends at the schedule's final value: 1 for the ELBO, below 1 for a
    tempered ("cold") posterior (see the module docstring, "Tempered posteriors").

    Args:
        num_examples: int > 0, ``N``, the number of training examples (not batches).
        schedule: a name (``"constant", "linear", "warmup", "cosine", "cyclic",
            "blundell"``), a :class:`tfbnn.schedules.Schedule`, or a callable
            ``(epoch, batch, steps_per_epoch) -> beta``. Default ``"linear"``
            (0 -> 1 over 10 epochs).
        steps_per_epoch: int or None. Minibatches per epoch; read from ``fit`` when
            None. Needed by ``"blundell"`` and for per-batch ramps on datasets of
            unknown length.

    Example:
        >>> import keras, numpy as np, tfbnn
        >>> x = np.random.default_rng(0).normal(size=(64, 4)).astype("float32")
        >>> y = (x[:, 0] > 0).astype("int32")
        >>> model = keras.Sequential([keras.Input((4,)), tfbnn.DenseFlipout(2, activation="softmax", seed=0)])
        >>> model.compile("adam", "sparse_categorical_crossentropy")
        >>> cb = tfbnn.KLAnnealing(num_examples=len(x), schedule=tfbnn.schedules.WarmUp(1, 2))
        >>> history = model.fit(x, y, epochs=3, batch_size=32, callbacks=[cb], verbose=0)
        >>> history.history["kl_beta"]   # beta at each epoch's last batch (2 batches per epoch)
        [0.0, 0.25, 0.75]

    With ``fit(steps_per_execution=k)`` Keras calls batch hooks once per k steps,
    so beta changes every k batches.
    """

    def __init__(self, num_examples, schedule="linear", steps_per_epoch=None):
        super().__init__()
        self.num_examples = checks.integer(
            "num_examples", num_examples, 1, what="a positive integer (N, the number of training examples)"
        )
        self.schedule = schedules_lib.get(schedule)
        self.steps_per_epoch = checks.integer("steps_per_epoch", steps_per_epoch, 1, allow_none=True)
        self._epoch = 0
        self.beta = None

    def on_train_begin(self, logs=None):
        if not bayesian_layers(self.model):
            warnings.warn("KLAnnealing: the model has no tfbnn Bayesian layer; it has no effect.")
        self._steps = self.steps_per_epoch or (self.params or {}).get("steps")
        if getattr(self.schedule, "needs_steps_per_epoch", False) and not self._steps:
            raise ValueError(
                f"The schedule {self.schedule!r} needs the number of minibatches per epoch, and "
                "`fit` does not know it (a dataset of unknown length). Pass "
                "`KLAnnealing(..., steps_per_epoch=M)`. Received: steps_per_epoch=None"
            )
        # Before the first trace of the train step: the layers know N from here on.
        self._apply(keras_private.initial_epoch(self.model), 0)

    def beta_at(self, epoch, batch):
        """The beta this callback uses at ``(epoch, batch)`` of the current run."""
        return float(self.schedule(epoch, batch, self._steps))

    def _apply(self, epoch, batch):
        self.beta = self.beta_at(epoch, batch)
        set_kl_weight(self.model, self.beta / self.num_examples)

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch

    def on_train_batch_begin(self, batch, logs=None):
        self._apply(self._epoch, batch)

    def on_train_batch_end(self, batch, logs=None):
        if logs is not None:
            logs["kl_beta"] = self.beta

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None:
            logs["kl_beta"] = self.beta


class SparsityMonitor(keras.callbacks.Callback):
    """Logs the sparsity the posterior implies, per layer, at the end of every epoch.

    Adds ``sparsity`` (all prunable kernels) and ``sparsity/<layer name>`` to the
    epoch logs (so to ``History`` and TensorBoard) and keeps every epoch's
    :class:`SparsityReport` in ``self.reports``.

    Args:
        criterion: ``"auto"``, ``"snr"`` or ``"log_alpha"`` (see :func:`compute_masks`).
        threshold: float or None (the criterion's default).
        verbose: 0 or 1; 1 prints one line per epoch.

    Example:
        >>> import keras, numpy as np, tfbnn
        >>> x = np.random.default_rng(0).normal(size=(64, 4)).astype("float32")
        >>> y = (x[:, 0] > 0).astype("int32")
        >>> model = keras.Sequential([keras.Input((4,)), tfbnn.DenseVariationalDropout(2, activation="softmax", seed=0)])
        >>> model.compile("adam", "sparse_categorical_crossentropy")
        >>> monitor = tfbnn.callbacks.SparsityMonitor()
        >>> history = model.fit(x, y, epochs=2, callbacks=[tfbnn.KLAnnealing(len(x)), monitor], verbose=0)
        >>> len(history.history["sparsity"]), len(monitor.reports)   # one value and report per epoch
        (2, 2)
    """

    def __init__(self, criterion="auto", threshold=None, verbose=0):
        super().__init__()
        if criterion not in pruning.CRITERIA:
            raise ValueError(f"Expected `criterion` in {pruning.CRITERIA}. Received: criterion={criterion!r}")
        if threshold is not None:
            pruning.check_threshold("snr" if criterion == "snr" else "log_alpha", threshold)
        self.criterion = criterion
        self.threshold = threshold
        self.verbose = verbose
        self.reports = []

    def on_train_begin(self, logs=None):
        pruning.require_prunable_layers(self.model)

    def on_epoch_end(self, epoch, logs=None):
        report = pruning.sparsity_report(self.model, criterion=self.criterion, threshold=self.threshold)
        self.reports.append(report)
        if logs is not None:
            logs["sparsity"] = report.sparsity
            for row in report.layers:
                logs[f"sparsity/{row.name}"] = row.sparsity
        if self.verbose:
            per_layer = ", ".join(f"{r.name} {100 * r.sparsity:.1f}%" for r in report.layers)
            print(f"epoch {epoch + 1}: sparsity {100 * report.sparsity:.2f}% ({per_layer})")


class NaNGuard(keras.callbacks.TerminateOnNaN):
    """``keras.callbacks.TerminateOnNaN`` that remembers where the loss stopped being finite.

    After training, ``where`` is ``None`` or ``(epoch, batch, loss)`` (1-based) of the
    first non-finite batch loss, and :meth:`message` says it in words, so a failed run
    can report where training diverged.

    Example:
        >>> import keras, numpy as np, tfbnn
        >>> x = np.full((8, 2), np.nan, "float32")            # NaN inputs: the loss becomes NaN
        >>> model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
        >>> model.compile("sgd", "mse")
        >>> guard = tfbnn.callbacks.NaNGuard()
        >>> _ = model.fit(x, np.zeros(8), epochs=3, callbacks=[guard], verbose=0)
        Batch 0: Invalid loss, terminating training
        >>> guard.message()
        'the loss became nan at epoch 1, batch 1'
    """

    def __init__(self):
        super().__init__()
        self.epoch = 0
        self.where = None

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_batch_end(self, batch, logs=None):
        loss = (logs or {}).get("loss")
        if loss is not None and self.where is None and not math.isfinite(float(loss)):
            self.where = (self.epoch + 1, batch + 1, float(loss))
        super().on_batch_end(batch, logs)

    def message(self):
        """``"the loss became nan at epoch E, batch B"``, or ``""`` when training stayed finite."""
        if self.where is None:
            return ""
        epoch, batch, loss = self.where
        return f"the loss became {loss} at epoch {epoch}, batch {batch}"


class EpochTimer(keras.callbacks.Callback):
    """Adds ``seconds``, the wall time of the epoch, to the epoch logs (and so to ``History``)."""

    def on_epoch_begin(self, epoch, logs=None):
        self._start = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None:
            logs["seconds"] = time.perf_counter() - self._start


class PosteriorBoard(keras.callbacks.Callback):
    """Writes the posterior to TensorBoard after every epoch: KL per layer, scales, signal-to-noise, log-alpha,
    and the Monte Carlo predictive on validation data with its reliability diagram.

    Beside ``keras.callbacks.TensorBoard`` (which writes ``<log_dir>/train`` and
    ``/validation``), this writes ``<log_dir>/posterior``. Per epoch (step = epoch):

    - scalars ``kl/<layer>`` (the layer's unscaled ``KL(q || p)``), ``kl/total``,
      ``kl_scaled/<layer>`` (``kl_weight * KL``, what the loss holds), ``kl_share/<layer>``
      (that over the epoch's mean ``loss``) and ``kl_beta`` when :class:`KLAnnealing` logs it;
    - for every layer with a kernel posterior (:func:`tfbnn.pruning.prunable_layers`), every
      epoch scalars ``prunable/snr<th>/<layer>``, the fraction of weights with
      ``|mu| / sigma < th`` for each of ``snr_thresholds``, and every ``histogram_every``
      epochs histograms ``posterior_scale/<layer>`` (``sigma``) and ``log10_snr/<layer>``
      (``log10 |mu| / sigma``, Graves 2011);
    - for variational dropout (a ``log_alpha()``), ``sparsity/<layer>``, the fraction with
      ``log alpha > 3`` (Molchanov et al. 2017), and the histogram ``log_alpha/<layer>``;
    - with ``validation_data`` ``(x, y)`` of a classifier, every ``validation_every``
      epochs: ``validation/accuracy``, ``validation/nll``, ``validation/ece``
      (``num_bins``), ``validation/predictive_entropy`` and ``validation/mutual_information``
      (means) from ``tfbnn.predict(model, x, num_samples)`` on the first ``max_examples``
      rows, kept as :attr:`last_prediction`; at the last epoch (and every
      ``reliability_every`` epochs) the image ``validation/reliability_diagram``
      (:func:`tfbnn.plots.reliability_diagram`).

    Every quantity is written at epoch 0 and every so many epochs after, and at the last
    epoch; the writer flushes as TensorFlow's does (every two minutes) and when training
    ends. The per-epoch scalars go out in one compiled call. What the board costs against
    an epoch of the main job is measured by ``benchmarks/posterior_board.py``.

    Under ``tf.distribute`` only the chief writes (:func:`tfbnn.distribute.is_chief`).

    Args:
        log_dir: the TensorBoard folder (``tensorboard --logdir log_dir``).
        validation_data: ``(x, y)`` with integer labels, or None.
        num_samples: int >= 1, T of the validation predictive. Default 20.
        max_examples: int >= 1, validation rows used. Default 1000.
        snr_thresholds: floats > 0. Default ``(0.5, 0.83, 2.0)`` (0.83: Graves').
        histogram_every: int >= 1. Default 10.
        validation_every: int >= 1. Default 10.
        reliability_every: int >= 1 or None (the last epoch only), a multiple of ``validation_every``.
            Default None.
        num_bins: int >= 1, the ECE's and the diagram's bins. Default 15.

    Example:
        >>> import os, tempfile, keras, numpy as np, tfbnn
        >>> x = np.random.default_rng(0).normal(size=(64, 4)).astype("float32")
        >>> y = (x[:, 0] > 0).astype("int32")
        >>> model = keras.Sequential([keras.Input((4,)), tfbnn.DenseFlipout(2, activation="softmax", seed=0)])
        >>> model.compile("adam", "sparse_categorical_crossentropy")
        >>> board = tfbnn.callbacks.PosteriorBoard(tempfile.mkdtemp(), validation_data=(x, y), num_samples=5)
        >>> _ = model.fit(x, y, epochs=2, callbacks=[tfbnn.KLAnnealing(len(x)), board], verbose=0)
        >>> sorted(os.listdir(board.log_dir)), board.last_prediction.mean_probs.shape
        (['posterior'], (64, 2))
    """

    def __init__(self, log_dir, validation_data=None, num_samples=20, max_examples=1000,
                 snr_thresholds=(0.5, pruning.DEFAULT_SNR_THRESHOLD, 2.0), histogram_every=10, validation_every=10,
                 reliability_every=None, num_bins=15):
        super().__init__()
        if not isinstance(log_dir, (str, os.PathLike)):
            raise ValueError(f"Expected `log_dir` to be a folder path. Received: log_dir={log_dir!r}")
        self.log_dir = os.fspath(log_dir)
        if validation_data is not None and (not isinstance(validation_data, (tuple, list))
                                            or len(validation_data) != 2):
            raise ValueError("Expected `validation_data` to be a pair (x, y) or None. "
                             f"Received: validation_data of type {type(validation_data).__name__}")
        self.validation_data = validation_data
        self.num_samples = checks.integer("num_samples", num_samples, 1)
        self.max_examples = checks.integer("max_examples", max_examples, 1)
        if isinstance(snr_thresholds, (int, float)) or not all(
                checks.is_number(t) and t > 0 for t in snr_thresholds):
            raise ValueError(f"Expected `snr_thresholds` to be numbers > 0. Received: snr_thresholds={snr_thresholds!r}")
        self.snr_thresholds = tuple(float(t) for t in snr_thresholds)
        self.histogram_every = checks.integer("histogram_every", histogram_every, 1)
        self.validation_every = checks.integer("validation_every", validation_every, 1)
        self.reliability_every = checks.integer("reliability_every", reliability_every, 1, allow_none=True)
        if self.reliability_every and self.reliability_every % self.validation_every:
            raise ValueError("Expected `reliability_every` to be a multiple of `validation_every` (the image is of "
                             f"the validation predictive). Received: reliability_every={reliability_every}, "
                             f"validation_every={validation_every}")
        self.num_bins = checks.integer("num_bins", num_bins, 1)
        self.last_prediction = None
        self._writer = None

    def on_train_begin(self, logs=None):
        self._last_epoch = (self.params or {}).get("epochs", 0) - 1
        if distribute.is_chief(self.model.distribute_strategy) and self._writer is None:
            self._writer = tf.summary.create_file_writer(os.path.join(self.log_dir, "posterior"))
            self._kl_layers = bayesian_layers(self.model)
            self._state = None  # made at the first epoch's end, when a model built by its first batch is built
            self._compiled_writes = {}

    def on_train_end(self, logs=None):
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def on_epoch_end(self, epoch, logs=None):
        if self._writer is None:
            return
        logs = logs or {}
        if self._state is None:
            self._state = self._state_function()
        kls, scales = self._state()
        scalars = self._kl_scalars(kls.numpy(), logs)
        histograms = {} if self._due(epoch, self.histogram_every) else None
        for layer, scale in zip(self._prunable, scales):
            self._layer_summaries(layer, scale.numpy(), scalars, histograms)
        self._write(tf.summary.scalar, scalars, epoch)
        if histograms is not None:
            self._write(tf.summary.histogram, histograms, epoch)
        validation = self.validation_data is not None and self._due(epoch, self.validation_every)
        if validation:  # its own compiled write: the per-epoch one keeps one set of tags
            validation_scalars = {}
            probs, labels = self._validation_scalars(validation_scalars)
            self._write(tf.summary.scalar, validation_scalars, epoch)
        with self._writer.as_default(step=epoch):
            if validation and (epoch == self._last_epoch
                               or (self.reliability_every and epoch % self.reliability_every == 0)):
                tf.summary.image("validation/reliability_diagram", self._reliability_image(probs, labels))

    def _write(self, summary, values, epoch):
        """``{tag: value}`` through ``summary`` (``tf.summary.scalar`` or ``.histogram``) in one compiled call, traced
        once per set of tags and shapes (one eager summary op costs about a millisecond); scalars travel as one
        tensor (a list of them cost the call a few milliseconds of argument matching)."""
        key = (summary, tuple((tag, np.shape(value)) for tag, value in values.items()))
        if key not in self._compiled_writes:
            writer, tags = self._writer, tuple(values)

            @tf.function(autograph=False)
            def write(tensors, step):
                with writer.as_default(step=step):
                    for i, tag in enumerate(tags):
                        summary(tag, tensors[i])
            self._compiled_writes[key] = write
        if all(np.ndim(value) == 0 for value in values.values()):
            tensors = tf.constant(np.fromiter(values.values(), np.float32, len(values)))
        else:
            tensors = [tf.constant(value, tf.float32) for value in values.values()]
        self._compiled_writes[key](tensors, tf.constant(epoch, tf.int64))

    def _state_function(self):
        """One compiled call that gives every Bayesian layer's KL (as one float32 vector) and every prunable
        layer's posterior scales: one call per epoch (an eager softplus per layer, or a call each for the KLs
        and the scales, cost more than the epoch's scalars themselves)."""
        kl_layers, prunable = self._kl_layers, pruning.prunable_layers(self.model)
        self._prunable = prunable

        def state():
            kls = [tf.reshape(tf.cast(layer.kl_divergence(), tf.float32), []) for layer in kl_layers]
            return (tf.stack(kls) if kls else tf.zeros([0]),
                    [tf.convert_to_tensor(layer.kernel_scale()) for layer in prunable])
        return tf.function(state)

    def _kl_scalars(self, kls, logs):
        kls = [float(kl) for kl in kls]
        scalars = {}
        for layer, kl in zip(self._kl_layers, kls):
            scalars[f"kl/{layer.name}"] = kl
            weight = getattr(layer, "kl_weight", None)
            if weight is not None:
                scaled = float(weight) * kl
                scalars[f"kl_scaled/{layer.name}"] = scaled
                if logs.get("loss"):
                    scalars[f"kl_share/{layer.name}"] = scaled / float(logs["loss"])
        scalars["kl/total"] = float(sum(kls))
        if "kl_beta" in logs:
            scalars["kl_beta"] = float(logs["kl_beta"])
        return scalars

    def _due(self, epoch, every):
        return epoch % every == 0 or epoch == self._last_epoch

    def _layer_summaries(self, layer, scale, scalars, histograms):
        """Adds ``layer``'s scalars to ``scalars`` and, unless ``histograms`` is None, its histograms
        (``scale``: its ``kernel_scale()``, as NumPy)."""
        snr = pruning.signal_to_noise(layer, scale)
        for threshold in self.snr_thresholds:
            scalars[f"prunable/snr{threshold:g}/{layer.name}"] = float(np.mean(snr < threshold))
        log_alpha = layer.log_alpha().numpy() if hasattr(layer, "log_alpha") else None
        if log_alpha is not None:
            scalars[f"sparsity/{layer.name}"] = float(np.mean(log_alpha > pruning.DEFAULT_LOG_ALPHA_THRESHOLD))
        if histograms is None:
            return
        histograms[f"posterior_scale/{layer.name}"] = scale.ravel()
        histograms[f"log10_snr/{layer.name}"] = np.log10(np.maximum(snr, 1e-30)).ravel()
        if log_alpha is not None:
            histograms[f"log_alpha/{layer.name}"] = log_alpha.ravel()

    def _validation_scalars(self, scalars):
        x, y = self.validation_data
        x, y = x[: self.max_examples], np.asarray(y)[: self.max_examples]
        res = predict(self.model, x, num_samples=self.num_samples)
        self.last_prediction = res
        probs = res.mean_probs
        scalars["validation/accuracy"] = float(np.mean(probs.argmax(-1) == y))
        scalars["validation/nll"] = float(metrics.negative_log_likelihood(probs, y))
        scalars["validation/ece"] = float(metrics.expected_calibration_error(probs, y, self.num_bins))
        scalars["validation/predictive_entropy"] = float(np.mean(res.predictive_entropy))
        scalars["validation/mutual_information"] = float(np.mean(res.mutual_information))
        return probs, y

    def _reliability_image(self, probs, labels):
        """The diagram as a ``(1, height, width, 4)`` uint8 RGBA tensor, rendered straight from matplotlib's Agg
        canvas at 80 dpi with fixed margins: the constrained layout and a PNG encoded here only to be decoded
        again were 40% of the image's time (0.205 -> 0.119 s of CPU)."""
        from matplotlib.backends.backend_agg import FigureCanvasAgg

        from tfbnn import plots

        fig = plots.reliability_diagram(probs, labels, self.num_bins, title="Reliability diagram (validation)")
        fig.set_layout_engine("none")
        fig.axes[0].set_position([0.13, 0.12, 0.84, 0.8])
        fig.set_dpi(80)
        canvas = FigureCanvasAgg(fig)
        canvas.draw()
        return tf.constant(np.asarray(canvas.buffer_rgba())[None])
