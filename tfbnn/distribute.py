"""Training under ``tf.distribute``: choosing a strategy, and what changes for a BNN.

=================  =========================================================
strategy name      what it gives
=================  =========================================================
``"auto"``         ``"multi_worker"`` when ``TF_CONFIG`` describes a cluster of
                   more than one task, ``"mirrored"`` with more than one local
                   GPU, ``"default"`` otherwise
``"default"``      TensorFlow's default strategy: one device, no replicas
``"mirrored"``     ``tf.distribute.MirroredStrategy`` over all local GPUs (or
                   the given ``devices``; with no GPU but several logical CPUs,
                   see :func:`split_cpu`, over those)
``"multi_worker"`` ``tf.distribute.MultiWorkerMirroredStrategy`` across the
                   machines of ``TF_CONFIG`` (every worker runs the same script)
=================  =========================================================

Usage: make the model, its optimizer and its compile inside ``strategy.scope()``
(the layers' weights, KL weights and seed states then become mirrored variables);
``fit`` and :class:`tfbnn.KLAnnealing` work as usual::

    strategy = tfbnn.distribute.get_strategy("auto")
    with strategy.scope():
        model = build_model()
        model.compile(optimizer="adam", loss="sparse_categorical_crossentropy",
                      jit_compile=tfbnn.distribute.jit_compile_for(strategy, True))
    model.fit(data.train, epochs=10, callbacks=[tfbnn.KLAnnealing(num_examples=data.num_examples)])

What was checked (``tests/test_distribute.py``, 2 logical CPUs):

* The ELBO convention holds unchanged. ``batch_size`` is the global batch, split
  across replicas; Keras scales each replica's loss, ``layer.losses`` (the KL
  terms) included, by ``1 / num_replicas`` before the gradients are summed, so
  the KL enters once per step with ``kl_weight = beta / N``. One SGD step under
  ``MirroredStrategy`` matches the single-device step, loss and update, when the
  noise is switched off.
* Replicas draw distinct noise: every replica folds its
  ``replica_id_in_sync_group`` into the layer's stateless seed
  (:meth:`tfbnn.layers.StochasticLayer._next_seed`); the mirrored seed state
  advances identically on every replica, so a seeded run stays reproducible.
* ``jit_compile=True`` fails under ``MirroredStrategy`` on logical CPUs
  (``InvalidArgumentError``: a resource on another device), even with plain
  ``keras.layers.Dense``; :func:`jit_compile_for` turns XLA off under any
  multi-replica strategy.
* Two ``MultiWorkerMirroredStrategy`` workers on 127.0.0.1 train and end with
  the same weights -- through :func:`fit`, not ``model.fit``: in Keras 3 (checked
  on 3.15) ``model.fit`` fails under ``MultiWorkerMirroredStrategy`` with more than
  one worker (``strategy.reduce`` on a nested batch and on scalar logs with
  ``axis=0``; keras-team/keras#20585). :func:`fit` calls ``model.fit`` under every
  other strategy and runs a plain distributed loop (the compiled loss and
  optimizer, ``layer.losses`` included, Keras callbacks) under a multi-worker one.
"""

import json
import os
import warnings

import keras
import tensorflow as tf

__all__ = [
    "STRATEGIES",
    "get_strategy",
    "resolve_strategy_name",
    "split_cpu",
    "num_replicas",
    "jit_compile_for",
    "is_chief",
    "fit",
    "add_strategy_argument",
    "strategy_from_args",
]

#: Names accepted by :func:`get_strategy`.
from tfbnn._internal.argtypes import STRATEGIES, add_strategy_argument  # noqa: E402  (TF-free, for the command line)


def _tf_config(tf_config=None):
    """``TF_CONFIG`` (or the given string / dict) as a dict; ``{}`` when unset."""
    raw = os.environ.get("TF_CONFIG", "") if tf_config is None else tf_config
    if isinstance(raw, dict):
        return raw
    if not raw:
        return {}
    try:
        config = json.loads(raw)
    except json.JSONDecodeError as e:
        raise ValueError(f"TF_CONFIG is not valid JSON ({e}). Received: TF_CONFIG={raw!r}") from None
    if not isinstance(config, dict):
        raise ValueError(f"Expected TF_CONFIG to be a JSON object. Received: TF_CONFIG={raw!r}")
    return config


def _cluster_tasks(config):
    """The number of chief + worker tasks in a ``TF_CONFIG`` cluster."""
    cluster = config.get("cluster") or {}
    return sum(len(cluster.get(job) or ()) for job in ("chief", "worker"))


def resolve_strategy_name(name="auto", tf_config=None, num_gpus=None):
    """The concrete strategy name ``get_strategy(name)`` would make.

    Args:
        name: one of :data:`STRATEGIES`.
        tf_config: ``TF_CONFIG`` as a JSON string or dict; default: the environment.
        num_gpus: the number of local GPUs; default: the visible ones.

    Returns:
        ``"default"``, ``"mirrored"`` or ``"multi_worker"``.
    """
    if not isinstance(name, str) or name not in STRATEGIES:
        raise ValueError(f"Unknown strategy. Expected one of {list(STRATEGIES)}. Received: strategy={name!r}")
    if name != "auto":
        return name
    if _cluster_tasks(_tf_config(tf_config)) > 1:
        return "multi_worker"
    if num_gpus is None:
        num_gpus = len(tf.config.list_physical_devices("GPU"))
    return "mirrored" if num_gpus > 1 else "default"


def _mirrored_devices():
    gpus = tf.config.list_logical_devices("GPU")
    if gpus:
        return [d.name for d in gpus]
    return [d.name for d in tf.config.list_logical_devices("CPU")]


def get_strategy(name="auto", devices=None):
    """A ``tf.distribute.Strategy`` by name.

    Args:
        name: ``"auto"`` (default), ``"default"``, ``"mirrored"`` or ``"multi_worker"``
            (see the module docstring).
        devices: list of device names for ``"mirrored"`` (e.g. ``["/gpu:0", "/gpu:1"]``
            or ``["/cpu:0", "/cpu:1"]``); default: every local GPU, else every
            logical CPU.

    Returns:
        The strategy. Build and compile models inside ``strategy.scope()``.

    Raises:
        ValueError: an unknown name, ``devices`` with a strategy other than
            ``"mirrored"``, or a malformed ``TF_CONFIG``.

    Example:
        >>> import tfbnn
        >>> strategy = tfbnn.distribute.get_strategy("mirrored", devices=["/cpu:0"])
        >>> strategy.num_replicas_in_sync     # one replica per device ...
        1
        >>> # ... e.g. two on a CPU split before TensorFlow starts (split_cpu(2)): devices=["/cpu:0", "/cpu:1"]
    """
    resolved = resolve_strategy_name(name)
    if devices is not None:
        if resolved != "mirrored":
            raise ValueError(
                f"`devices` applies to the mirrored strategy only. Received: devices={devices!r} "
                f"with strategy={name!r}"
            )
        if isinstance(devices, str) or not devices or not all(isinstance(d, str) for d in devices):
            raise ValueError(
                f"Expected `devices` to be a non-empty list of device names. Received: devices={devices!r}"
            )
    if resolved == "default":
        return tf.distribute.get_strategy()
    if resolved == "mirrored":
        return tf.distribute.MirroredStrategy(devices=list(devices or _mirrored_devices()))
    return tf.distribute.MultiWorkerMirroredStrategy()


def split_cpu(num_devices=2):
    """Splits the first physical CPU into ``num_devices`` logical devices.

    For trying ``MirroredStrategy`` on a machine without GPUs (tests, demos).
    TensorFlow fixes its devices the first time it uses them, so call this at the
    start of the process, before any tensor is made; the test suite runs such
    code in a subprocess.

    Args:
        num_devices: int >= 1.

    Returns:
        The logical CPU device names, e.g. ``['/device:CPU:0', '/device:CPU:1']``.

    Raises:
        RuntimeError: TensorFlow has already initialised its devices with another count.
    """
    if isinstance(num_devices, bool) or not isinstance(num_devices, int) or num_devices < 1:
        raise ValueError(f"Expected `num_devices` to be a positive integer. Received: num_devices={num_devices!r}")
    cpu = tf.config.list_physical_devices("CPU")[0]
    try:
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * num_devices)
    except RuntimeError as e:
        current = tf.config.list_logical_devices("CPU")
        if len(current) != num_devices:
            raise RuntimeError(
                f"Cannot split the CPU into {num_devices} logical devices: TensorFlow already initialised "
                f"{len(current)} ({e}). Call tfbnn.distribute.split_cpu at the start of the process, "
                f"before any TensorFlow op. Received: num_devices={num_devices}"
            ) from None
    return [d.name for d in tf.config.list_logical_devices("CPU")]


def num_replicas(strategy=None):
    """Replicas in sync of ``strategy`` (default: the current one)."""
    return int((strategy or tf.distribute.get_strategy()).num_replicas_in_sync)


def jit_compile_for(strategy, jit_compile, warn=True):
    """The ``jit_compile`` to pass to ``model.compile`` under ``strategy``.

    XLA stays as asked with one replica and is turned off with several: under
    ``MirroredStrategy`` on logical CPUs an XLA train step fails
    (``InvalidArgumentError``, a resource on another device), and it was not
    verified on multi-GPU or multi-worker setups. Asking for ``True`` there warns.

    Args:
        strategy: a ``tf.distribute.Strategy``.
        jit_compile: bool or ``"auto"`` (Keras' values).
        warn: bool, whether turning off a ``True`` warns (False for a default the user
            did not choose).
    """
    if num_replicas(strategy) <= 1:
        return jit_compile
    if jit_compile is True and warn:
        warnings.warn(
            f"jit_compile=True is turned off under {type(strategy).__name__} with "
            f"{num_replicas(strategy)} replicas (XLA fails there on logical CPUs)."
        )
    return False


def is_chief(strategy=None, tf_config=None):
    """Whether this process should write outputs (saved models, reports).

    True except on the non-chief workers of a multi-worker cluster: the
    ``chief`` task, or worker 0 when the cluster has no chief.
    """
    if strategy is not None and not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return True
    config = _tf_config(tf_config)
    task = config.get("task") or {}
    cluster = config.get("cluster") or {}
    if not task:
        return True
    if task.get("type") == "chief":
        return True
    return task.get("type") == "worker" and int(task.get("index", 0)) == 0 and not cluster.get("chief")


# -- training --------------------------------------------------------------------------


def _in_multi_worker_mode(strategy):
    return isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy) and len(
        strategy.extended.worker_devices
    ) < strategy.num_replicas_in_sync


def fit(model, x, y=None, batch_size=32, epochs=1, steps_per_epoch=None, callbacks=None, verbose=0,
        shuffle=True, seed=None):
    """``model.fit`` that also works across several workers.

    Under the default strategy and ``MirroredStrategy`` this is ``model.fit(x, y,
    batch_size=..., epochs=..., steps_per_epoch=..., callbacks=..., verbose=...,
    shuffle=...)``. Under ``MultiWorkerMirroredStrategy`` with several workers,
    where Keras 3's ``fit`` fails, it runs a distributed loop doing what Keras'
    train step does: the model's compiled loss plus ``model.losses`` (the KL
    terms), each scaled by ``1 / num_replicas`` and all-reduced by the optimizer;
    callbacks (``KLAnnealing``, ``TerminateOnNaN``, ...) get ``{"loss": ...}`` logs,
    the running mean over the epoch; compiled metrics are not computed. Every
    worker must call it with the same arguments.

    Args:
        model: a model compiled inside ``strategy.scope()``.
        x: NumPy inputs (with ``y``) or a ``tf.data.Dataset`` of ``(x, y)`` global batches.
        y: NumPy targets, or None for a dataset.
        batch_size: the global batch size for NumPy inputs.
        epochs: int > 0.
        steps_per_epoch: int or None. Default: the batches in one pass over the data
            (a dataset must then have a known cardinality).
        callbacks: list of ``keras.callbacks.Callback``.
        verbose: 0 silent, 1 progress bar, 2 one line per epoch.
        shuffle: bool, reshuffle NumPy inputs every epoch.
        seed: int or None, seed of that shuffle in the multi-worker loop.

    Returns:
        The ``keras.callbacks.History`` of the run.
    """
    strategy = model.distribute_strategy
    if not _in_multi_worker_mode(strategy):
        fit_kwargs = {"epochs": epochs, "steps_per_epoch": steps_per_epoch, "callbacks": callbacks,
                      "verbose": verbose}
        if isinstance(x, tf.data.Dataset):
            fit_kwargs["shuffle"] = False  # Keras ignores it for datasets, but warns when True
        else:
            fit_kwargs.update(batch_size=batch_size, shuffle=shuffle)
        return model.fit(x, y, **fit_kwargs)
    dataset, steps = _repeated_dataset(x, y, batch_size, steps_per_epoch, shuffle, seed)
    return _multi_worker_loop(model, strategy, dataset, epochs, steps, callbacks, verbose)


def _repeated_dataset(x, y, batch_size, steps_per_epoch, shuffle, seed):
    """An endless dataset and the steps per epoch: every worker runs the same number of steps."""
    if isinstance(x, tf.data.Dataset):
        if y is not None:
            raise ValueError(f"Expected `y=None` with a tf.data.Dataset `x`. Received: y={type(y).__name__}")
        steps = steps_per_epoch
        if steps is None:
            steps = int(x.cardinality())
            if steps < 0:
                raise ValueError(
                    "Cannot tell the steps per epoch of a dataset of unknown or infinite length. Pass "
                    "`steps_per_epoch`. Received: steps_per_epoch=None"
                )
        dataset = x.repeat()
    else:
        n = len(x)
        dataset = tf.data.Dataset.from_tensor_slices((x, y))
        if shuffle:
            dataset = dataset.shuffle(n, seed=seed, reshuffle_each_iteration=True)
        dataset = dataset.repeat().batch(batch_size)
        steps = steps_per_epoch or -(-n // batch_size)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    return dataset.with_options(options), int(steps)


def _multi_worker_loop(model, strategy, dataset, epochs, steps, callbacks, verbose):
    if model.optimizer is None:
        raise ValueError("Expected a compiled model (call `model.compile` inside `strategy.scope()`).")
    with strategy.scope():
        model.optimizer.build(model.trainable_variables)

    def replica_step(x, y):
        with tf.GradientTape() as tape:
            y_pred = model(x, training=True)
            loss = model.compute_loss(x=x, y=y, y_pred=y_pred, training=True)  # already / num_replicas
            scaled = model.optimizer.scale_loss(loss)
        gradients = tape.gradient(scaled, model.trainable_variables)
        model.optimizer.apply_gradients(zip(gradients, model.trainable_variables))
        return loss

    @tf.function
    def train_step(iterator):
        x, y = next(iterator)
        return strategy.reduce("SUM", strategy.run(replica_step, args=(x, y)), axis=None)

    history = keras.callbacks.History()
    callback_list = keras.callbacks.CallbackList(
        list(callbacks or []) + [history], add_progbar=verbose != 0, model=model,
        verbose=verbose, epochs=epochs, steps=steps,
    )
    iterator = iter(strategy.experimental_distribute_dataset(dataset))
    model.stop_training = False
    callback_list.on_train_begin()
    logs = {}
    for epoch in range(epochs):
        callback_list.on_epoch_begin(epoch)
        total = 0.0
        for step in range(steps):
            callback_list.on_train_batch_begin(step)
            total += float(train_step(iterator))
            logs = {"loss": total / (step + 1)}
            callback_list.on_train_batch_end(step, logs)
            if model.stop_training:
                break
        callback_list.on_epoch_end(epoch, dict(logs))
        if model.stop_training:
            break
    callback_list.on_train_end(logs)
    return history


# -- command line -----------------------------------------------------------------


def strategy_from_args(args):
    """The strategy of parsed ``--strategy`` / ``--cpu-devices`` options.

    Raises:
        ValueError: bad option combinations (the CLI reports them as usage errors).
    """
    cpu_devices = getattr(args, "cpu_devices", None)
    name = getattr(args, "strategy", "auto")
    if cpu_devices is not None:
        if tf.config.list_physical_devices("GPU"):
            raise ValueError(
                f"--cpu-devices is for machines without GPUs; this one has GPUs. Received: --cpu-devices={cpu_devices}"
            )
        try:
            split_cpu(cpu_devices)
        except RuntimeError as e:
            raise ValueError(str(e)) from None
        if name == "auto":
            name = "mirrored" if cpu_devices > 1 else "default"
    return get_strategy(name)
