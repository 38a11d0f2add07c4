"""The ELBO convention and KL annealing: schedules, per-batch effect, resume."""

import math

import keras
import numpy as np
import pytest

import tfbnn
from tfbnn import priors, schedules


def test_schedule_formulas():
    m = 10
    assert schedules.Constant(0.5)(3, 7, m) == 0.5
    lin = schedules.Linear(epochs=4)
    assert lin(0, 0, m) == 0.0 and lin(1, 5, m) == pytest.approx(1.5 / 4) and lin(9, 0, m) == 1.0
    warm = schedules.WarmUp(warmup_epochs=2, epochs=2)
    assert warm(1, 9, m) == 0.0 and warm(3, 0, m) == pytest.approx(0.5) and warm(5, 0, m) == 1.0
    cos = schedules.Cosine(epochs=2)
    assert cos(1, 0, m) == pytest.approx(0.5) and cos(0, 5, m) == pytest.approx(0.5 * (1 - math.cos(math.pi / 4)))
    cyc = schedules.Cyclic(cycle_epochs=2, ratio=0.5)
    assert cyc(0, 5, m) == pytest.approx(0.5) and cyc(1, 5, m) == 1.0 and cyc(2, 0, m) == 0.0
    assert cyc(2, 5, m) == pytest.approx(0.5)


@pytest.mark.parametrize("m", [1, 5, 60, 2000])
def test_blundell_weights_are_m_times_pi_i(m):
    sched = schedules.Blundell()
    betas = np.array([sched(0, b, m) for b in range(m)])
    pis = np.array([2.0 ** (m - i) / (2.0**m - 1) for i in range(1, m + 1)]) if m < 1000 else None
    if pis is not None:
        np.testing.assert_allclose(betas, m * pis, rtol=1e-12)
    assert np.isfinite(betas).all()
    np.testing.assert_allclose(betas.mean(), 1.0, rtol=1e-9)  # an epoch carries one full KL
    assert np.all(np.diff(betas) <= 0)


def _zero_loss(y_true, y_pred):
    return keras.ops.mean(y_pred, axis=-1) * 0.0


class _Recorder(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.rows = []

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        layer = tfbnn.bayesian_layers(self.model)[0]
        self.rows.append((self.epoch, batch, float(logs["loss"]), float(layer.kl_weight.numpy())))


@pytest.mark.parametrize("jit_compile", [False, True])
def test_schedule_changes_the_loss_per_batch_inside_compiled_fit(jit_compile):
    n, batch = 40, 8
    x = np.random.default_rng(0).normal(size=(n, 5)).astype("float32")
    model = keras.Sequential([keras.Input((5,)), tfbnn.DenseLocalReparameterization(3, seed=1)])
    model.compile(keras.optimizers.SGD(0.0), _zero_loss, jit_compile=jit_compile)
    recorder = _Recorder()
    annealing = tfbnn.KLAnnealing(num_examples=n, schedule=schedules.Linear(epochs=2))
    model.fit(x, x[:, :3], batch_size=batch, epochs=2, shuffle=False, verbose=0, callbacks=[annealing, recorder])
    kl = float(model.layers[0].kl_divergence())  # closed form, unchanged at learning rate 0
    steps = n // batch
    for epoch in range(2):
        rows = [r for r in recorder.rows if r[0] == epoch]
        running = [r[2] for r in rows]
        per_batch = [running[0]] + [(k + 1) * running[k] - k * running[k - 1] for k in range(1, steps)]
        expected = [(epoch + b / steps) / 2 * kl / n for b in range(steps)]
        np.testing.assert_allclose(per_batch, expected, rtol=1e-4, atol=1e-6)
    assert len({round(r[3], 12) for r in recorder.rows}) == 2 * steps  # a new weight every batch


def test_one_batch_training_loss_equals_hand_computed_elbo():
    n = 100
    rng = np.random.default_rng(0)
    x = rng.normal(size=(16, 6)).astype("float32")
    y = rng.integers(0, 3, size=16)
    model = keras.Sequential(
        [
            keras.Input((6,)),
            tfbnn.DenseFlipout(8, activation="relu", kernel_prior=priors.Normal(0, 0.5), seed=1),
            tfbnn.DenseLocalReparameterization(3, activation="softmax", seed=2),
        ]
    )
    for layer in model.layers:
        layer.kernel_rho.assign(np.full(layer.kernel_rho.shape, -2.0, "float32"))
    tfbnn.set_kl_weight(model, 1.0 / n)
    model.compile(keras.optimizers.SGD(0.0), "sparse_categorical_crossentropy")
    states = [layer.seed_generator.state.numpy() for layer in model.layers]
    loss = float(model.train_on_batch(x, y))
    # Replay the same noise eagerly and compute NLL + KL / N by hand.
    for layer, state in zip(model.layers, states):
        layer.seed_generator.state.assign(state)
    probs = model(x, training=True).numpy()
    nll = -np.mean(np.log(probs[np.arange(16), y]))

    def normal_kl(mu, sigma, s):
        return np.sum(np.log(s / sigma) + (sigma**2 + mu**2) / (2 * s**2) - 0.5)

    kl = 0.0
    for layer, s in zip(model.layers, (0.5, 1.0)):
        sig_k = np.log1p(np.exp(layer.kernel_rho.numpy())) + 1e-6
        sig_b = np.log1p(np.exp(layer.bias_rho.numpy())) + 1e-6
        kl += normal_kl(layer.kernel_loc.numpy(), sig_k, s) + normal_kl(layer.bias_loc.numpy(), sig_b, 1.0)
    np.testing.assert_allclose(loss, nll + kl / n, rtol=1e-5)
    assert kl / n > 0.1 * nll  # the KL term is not negligible in this check


class _Interrupt(keras.callbacks.Callback):
    def on_train_batch_begin(self, batch, logs=None):
        if self._epoch == 2 and batch == 3:
            raise RuntimeError("interrupted")

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch


def _resume_model():
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input((4,)),
            tfbnn.DenseFlipout(8, activation="relu", kernel_prior="scale_mixture", seed=1,
                               kernel_initializer=keras.initializers.GlorotUniform(seed=1)),
            tfbnn.DenseReparameterization(2, seed=2, kernel_initializer=keras.initializers.GlorotUniform(seed=2)),
        ]
    )
    model.compile(keras.optimizers.Adam(1e-2), "mse")
    return model


def test_resumed_annealing_equals_uninterrupted(tmp_path):
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(48, 4)).astype("float32"), rng.normal(size=(48, 2)).astype("float32")
    fit_kwargs = dict(batch_size=8, epochs=5, shuffle=False, verbose=0)

    def annealing():
        return tfbnn.KLAnnealing(num_examples=48, schedule=schedules.Cosine(epochs=4))

    straight = _Recorder()
    model = _resume_model()
    model.fit(x, y, callbacks=[annealing(), straight], **fit_kwargs)
    final_straight = [w.numpy() for w in model.weights]

    backup = keras.callbacks.BackupAndRestore(str(tmp_path / "backup"))
    first, second = _Recorder(), _Recorder()
    model = _resume_model()
    with pytest.raises(RuntimeError, match="interrupted"):
        model.fit(x, y, callbacks=[annealing(), first, backup, _Interrupt()], **fit_kwargs)
    model = _resume_model()  # a fresh process would rebuild the model the same way
    model.fit(x, y, callbacks=[annealing(), second, backup], **fit_kwargs)

    assert second.rows[0][:2] == (2, 0)  # resumed at the start of the interrupted epoch
    expected = {(e, b): kw for e, b, _, kw in straight.rows}
    for e, b, _, kw in first.rows + second.rows:
        assert kw == pytest.approx(expected[(e, b)], rel=1e-7), (e, b)
    # Weights, optimizer state and the saved seed state restore: training continues exactly.
    for a, b in zip(final_straight, model.weights):
        np.testing.assert_allclose(a, b.numpy(), rtol=1e-5, atol=1e-6)


def test_kl_beta_is_logged_per_epoch():
    x = np.ones((20, 3), "float32")
    model = keras.Sequential([keras.Input((3,)), tfbnn.DenseFlipout(2, seed=0)])
    model.compile("adam", "mse")
    history = model.fit(x, x[:, :2], batch_size=10, epochs=3, verbose=0,
                        callbacks=[tfbnn.KLAnnealing(20, schedule=schedules.Linear(epochs=2))])
    np.testing.assert_allclose(history.history["kl_beta"], [0.25, 0.75, 1.0])


@pytest.mark.parametrize(
    "kwargs, match",
    [({"num_examples": n}, f"num_examples={n}") for n in (0, -5, 10.5)] + [
        ({"num_examples": 10, "schedule": "exponential"}, "schedule='exponential'"),
        ({"num_examples": 10, "steps_per_epoch": 0}, "Expected `steps_per_epoch`.*steps_per_epoch=0"),
    ],
)
def test_kl_annealing_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        tfbnn.KLAnnealing(**kwargs)


@pytest.mark.parametrize(
    "factory, match",
    [
        (lambda: schedules.Linear(epochs=0), "epochs=0"),
        (lambda: schedules.WarmUp(warmup_epochs=-1), "warmup_epochs=-1"),
        (lambda: schedules.Cyclic(ratio=1.5), "ratio=1.5"),
        (lambda: schedules.Cyclic(ratio="x"), "Expected `ratio`.*ratio='x'"),
        (lambda: schedules.Blundell()(0, 0, None), "steps_per_epoch=None"),
    ],
)
def test_schedule_bad_arguments(factory, match):
    with pytest.raises(ValueError, match=match):
        factory()


def test_numpy_scalars_are_accepted_as_keras_accepts_them():
    cb = tfbnn.KLAnnealing(num_examples=np.int64(100), steps_per_epoch=np.int32(5))
    assert (cb.num_examples, cb.steps_per_epoch) == (100, 5) and type(cb.num_examples) is int
    linear = schedules.Linear(np.int64(10), start=np.float32(0.0), end=np.float64(1.0))
    assert linear.get_config() == {"epochs": 10.0, "start": 0.0, "end": 1.0}
    assert schedules.WarmUp(np.int64(1), np.int32(2))(2, 0) == pytest.approx(0.5)
    assert schedules.Cyclic(np.int64(4), np.float32(0.5)).ratio == 0.5
    assert schedules.Constant(np.float16(1.0)).beta == 1.0
    with pytest.raises(ValueError, match="num_examples=True"):
        tfbnn.KLAnnealing(num_examples=True)
    with pytest.raises(ValueError, match="epochs=True"):
        schedules.Linear(True)


def test_blundell_schedule_needs_known_steps():
    import tensorflow as tf

    ds = tf.data.Dataset.from_tensor_slices((np.ones((8, 3), "float32"), np.ones((8, 2), "float32"))).batch(4)
    ds = ds.filter(lambda a, b: True)  # unknown cardinality
    model = keras.Sequential([keras.Input((3,)), tfbnn.DenseFlipout(2, seed=0)])
    model.compile("adam", "mse")
    with pytest.raises(ValueError, match="steps_per_epoch"):
        model.fit(ds, epochs=1, verbose=0, callbacks=[tfbnn.KLAnnealing(8, schedule="blundell")])
    model.fit(ds, epochs=1, verbose=0, callbacks=[tfbnn.KLAnnealing(8, "blundell", steps_per_epoch=2)])
