"""tfbnn.swag and tfbnn.hmc against independent computations (issue 22, parts 2 and 3).

SWAG: its moments and deviation matrix against NumPy on weight snapshots that a
separate callback saves during the same ``fit``; its draws' covariance against the
formula; save/load; the predictive through ``tfbnn.predict`` against running the
model by hand. HMC: Bayesian linear regression (one ``Dense(1)``, Gaussian prior,
known noise) has a Gaussian posterior in closed form; the draws' mean and variance
must match it within Monte Carlo error computed from the sampler's own ESS.
"""

import keras
import numpy as np
import pytest

import tfbnn
from tfbnn import hmc, swag


class _Snapshots(keras.callbacks.Callback):
    """Saves the flattened trainable weights at every epoch end (the NumPy reference's input)."""

    def __init__(self):
        super().__init__()
        self.weights = []

    def on_epoch_end(self, epoch, logs=None):
        self.weights.append(np.concatenate([np.asarray(v.numpy(), np.float64).ravel()
                                            for v in self.model.trainable_variables]))


def _regression_data(n=32, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 2)).astype("float32")
    y = (x @ np.array([[1.0], [-0.5]]) + 0.3 + 0.5 * rng.normal(size=(n, 1))).astype("float32")
    return x, y


def _trained_swag(epochs=9, max_rank=4, start_epoch=2, **kwargs):
    x, y = _regression_data()
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(4, activation="tanh"), keras.layers.Dense(1)])
    model.compile(keras.optimizers.SGD(0.1), "mse")
    collector = swag.SWAG(start_epoch=start_epoch, max_rank=max_rank, **kwargs)
    snapshots = _Snapshots()
    model.fit(x, y, epochs=epochs, batch_size=8, callbacks=[collector, snapshots], verbose=0)
    return model, collector, snapshots.weights, x


# -- SWAG ----------------------------------------------------------------------------------
def test_swag_moments_equal_numpy_on_snapshots():
    model, collector, snapshots, _ = _trained_swag(collect_every=2)
    kept = np.stack(snapshots[2::2])  # epochs 2, 4, 6, 8
    assert collector.num_snapshots == len(kept) == 4
    mean = kept.mean(axis=0)
    np.testing.assert_allclose(collector.swa_weights(), mean, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(collector.diagonal(), np.maximum((kept ** 2).mean(axis=0) - mean ** 2, 1e-30),
                               rtol=1e-7, atol=1e-12)
    running = np.cumsum(kept, axis=0) / np.arange(1, len(kept) + 1)[:, None]  # theta_bar_i (Algorithm 1)
    np.testing.assert_allclose(collector.deviations(), (kept - running).T, rtol=1e-10, atol=1e-12)


def test_swag_keeps_the_last_max_rank_deviations_and_collects_every_steps():
    _, collector, snapshots, _ = _trained_swag(epochs=8, max_rank=3, start_epoch=1)
    kept = np.stack(snapshots[1:])
    running = np.cumsum(kept, axis=0) / np.arange(1, len(kept) + 1)[:, None]
    np.testing.assert_allclose(collector.deviations(), (kept - running)[-3:].T, rtol=1e-10, atol=1e-12)
    stepped = swag.SWAG(collect_every_steps=3)
    model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    model.fit(np.ones((8, 1)), np.ones((8, 1)), batch_size=2, epochs=3, callbacks=[stepped], verbose=0)
    assert stepped.num_snapshots == 12 // 3


def test_swag_samples_have_the_swag_covariance():
    model, collector, _, _ = _trained_swag()
    posterior = collector.posterior(seed=0)
    d, k = collector.deviations(), collector.deviations().shape[1]
    expected = 0.5 * (np.diag(collector.diagonal()) + d @ d.T / (k - 1))  # Maddox et al. sec. 3.3
    np.testing.assert_allclose(posterior.covariance(), expected, rtol=1e-12)
    draws = posterior.sample(20000)
    assert draws.shape == (20000, collector.mean.shape[0])
    np.testing.assert_allclose(draws.mean(axis=0), collector.mean, atol=4 * np.sqrt(np.diag(expected).max() / 20000))
    # sample covariance: each entry's standard error is sqrt((S_ii S_jj + S_ij^2) / n)
    err = np.sqrt((np.outer(np.diag(expected), np.diag(expected)) + expected ** 2) / 20000)
    assert np.all(np.abs(np.cov(draws.T) - expected) < 5 * err + 1e-12)
    np.testing.assert_array_equal(posterior.sample(seed=3), collector.posterior().sample(seed=3))


def test_swag_predict_runs_the_model_with_the_draws(tmp_path):
    model, collector, _, x = _trained_swag()
    res = tfbnn.predict(collector.posterior(seed=1), x[:5], num_samples=7, return_samples=True)
    draws = collector.posterior(seed=1).sample(7)
    by_hand = []
    for theta in draws:  # write each draw into the model and run it
        start = 0
        for v in model.trainable_variables:
            size = int(np.prod(v.shape))
            v.assign(theta[start:start + size].reshape(v.shape))
            start += size
        by_hand.append(np.asarray(model(x[:5])))
    np.testing.assert_allclose(res.samples, np.stack(by_hand), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(res.epistemic_std, np.stack(by_hand).std(axis=0), rtol=1e-4, atol=1e-6)
    direct = tfbnn.predict(collector, x[:5], num_samples=4, return_samples=True)  # the callback itself
    assert direct.samples.shape == (4, 5, 1) and np.all(direct.epistemic_std > 0)


def test_swag_save_load_round_trip(tmp_path):
    model, collector, _, _ = _trained_swag()
    collector.save(tmp_path / "swag.npz")
    loaded = swag.load(tmp_path / "swag.npz", model)
    assert loaded.get_config() == collector.get_config() and loaded.num_snapshots == collector.num_snapshots
    for name in ("swa_weights", "diagonal", "deviations"):
        np.testing.assert_array_equal(getattr(loaded, name)(), getattr(collector, name)())
    np.testing.assert_array_equal(loaded.posterior().sample(seed=2), collector.posterior().sample(seed=2))
    with pytest.raises(ValueError, match="trainable weights"):
        swag.load(tmp_path / "swag.npz", keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)]))


def test_swag_batch_norm_statistics_are_recomputed_per_draw():
    x, y = _regression_data()
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(3), keras.layers.BatchNormalization(),
                              keras.layers.Dense(1)])
    model.compile(keras.optimizers.SGD(0.1), "mse")
    collector = swag.SWAG(max_rank=3)
    model.fit(x, y, epochs=4, batch_size=8, callbacks=[collector], verbose=0)
    posterior = collector.posterior(seed=0).bn_update(x, batch_size=8)
    theta = collector.posterior(seed=0).sample(1)  # the draw predict makes first
    res = tfbnn.predict(posterior, x[:4], num_samples=1, return_samples=True)
    # NumPy: the draw's weights; BN's statistics are the average of the 4 training batches' ones
    w1, b1, gamma, beta, w2, b2 = np.split(theta[0], np.cumsum([6, 3, 3, 3, 3]))
    h = x.astype(np.float64) @ w1.reshape(2, 3) + b1
    batches = h.reshape(4, 8, 3)
    mean, var = batches.mean(axis=1).mean(axis=0), batches.var(axis=1).mean(axis=0)
    bn = gamma * (h - mean) / np.sqrt(var + 1e-3) + beta
    np.testing.assert_allclose(res.samples[0], (bn @ w2.reshape(3, 1) + b2)[:4], rtol=1e-3, atol=1e-3)


def test_swag_bad_arguments():
    with pytest.raises(ValueError, match="max_rank=1"):
        swag.SWAG(max_rank=1)
    with pytest.raises(ValueError, match="start_epoch=-1"):
        swag.SWAG(start_epoch=-1)
    with pytest.raises(ValueError, match="0 snapshots"):
        swag.SWAG().posterior()
    _, collector, _, _ = _trained_swag()
    with pytest.raises(ValueError, match="scale=0"):
        collector.posterior(scale=0)


# -- HMC -------------------------------------------------------------------------------------
def _linear_posterior(x, y, noise, prior):
    """The closed-form Gaussian posterior of [w; b] for y = x w + b + N(0, noise^2)."""
    features = np.concatenate([x, np.ones((len(x), 1))], axis=1).astype(np.float64)
    precision = features.T @ features / noise ** 2 + np.eye(features.shape[1]) / prior ** 2
    cov = np.linalg.inv(precision)
    return cov @ features.T @ y[:, 0].astype(np.float64) / noise ** 2, cov


@pytest.mark.heavy
def test_nuts_recovers_the_conjugate_linear_regression_posterior():
    x, y = _regression_data(n=20)
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    res = hmc.sample(model, x, y, noise_scale=0.5, prior_scale=1.0, num_chains=4, num_results=250,
                     num_burnin=150, step_size=0.05, init="prior", jit_compile=False, seed=1)
    mean, cov = _linear_posterior(x, y, 0.5, 1.0)
    draws = res.pooled()
    assert res.samples.shape == (4, 250, 3) and np.all(res.r_hat < 1.05) and np.all(res.ess > 200)
    se_mean = np.sqrt(np.diag(cov) / res.ess)
    assert np.all(np.abs(draws.mean(axis=0) - mean) < 4 * se_mean), (draws.mean(axis=0), mean, se_mean)
    se_var = np.diag(cov) * np.sqrt(2 / res.ess)
    assert np.all(np.abs(draws.var(axis=0) - np.diag(cov)) < 4 * se_var), (draws.var(axis=0), np.diag(cov))
    corr = np.corrcoef(draws.T)
    expected_corr = cov / np.sqrt(np.outer(np.diag(cov), np.diag(cov)))
    assert np.all(np.abs(corr - expected_corr) < 4 * (1 - expected_corr ** 2) / np.sqrt(res.ess.min()) + 1e-9)
    assert np.all((res.acceptance_rate > 0.5) & (res.acceptance_rate <= 1)) and res.seconds > 0
    assert np.all(res.r_hat_outputs(x[:5]) < 1.05)
    # the predictive: the draws' mean function and the known noise as the aleatoric std
    pred = res.predictive(x[:3])
    np.testing.assert_allclose(pred.mean[:, 0], x[:3] @ draws[:, :2].mean(axis=0) + draws[:, 2].mean(), rtol=1e-4,
                               atol=1e-5)
    np.testing.assert_allclose(pred.aleatoric_std, 0.5)


def test_hmc_categorical_softmax_model_is_sampled_on_logits():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(30, 2)).astype("float32")
    y = (x[:, 0] > 0).astype("int32")
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(2, activation="softmax")])
    res = hmc.sample(model, x, y, likelihood="categorical", num_chains=2, num_results=50, num_burnin=50,
                     kernel="hmc", num_leapfrog_steps=3, jit_compile=False)
    pred = tfbnn.predict(res, x, num_samples=20, return_samples=True)
    w = res.weight_draws(20)
    logits = np.einsum("nd,tdk->tnk", x, w[:, :4].reshape(20, 2, 2)) + w[:, None, 4:]
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    np.testing.assert_allclose(pred.samples, probs / probs.sum(-1, keepdims=True), rtol=1e-4, atol=1e-5)
    assert np.mean(pred.predicted_class == y) > 0.8


def test_hmc_bad_arguments():
    x, y = _regression_data(n=4)
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    with pytest.raises(ValueError, match="kernel='mala'"):
        hmc.sample(model, x, y, kernel="mala")
    with pytest.raises(ValueError, match="prior_scale=-1"):
        hmc.sample(model, x, y, prior_scale=-1)
    with pytest.raises(ValueError, match="noise_scale=0.5"):
        hmc.sample(model, x, y, likelihood="categorical", noise_scale=0.5)
    with pytest.raises(ValueError, match="integer labels"):
        hmc.sample(keras.Sequential([keras.Input((2,)), keras.layers.Dense(2)]), x, y, likelihood="categorical")


def test_output_r_hat_is_gelman_rubin_of_each_chains_outputs():
    """``r_hat_outputs`` against Gelman and Rubin's formula written out on the outputs of each
    chain's draws (a linear model: output = x @ w + b), with chains deliberately apart."""
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    rng = np.random.default_rng(4)
    chains, draws = 3, 50
    samples = rng.normal(size=(chains, draws, 3))
    samples[..., 2] += np.array([0.0, 1.5, 3.0])[:, None]  # each chain's bias apart
    fields = dict(model=model, noise=None, likelihood="normal", noise_scale=0.5, r_hat=np.ones(3), ess=np.ones(3),
                  acceptance_rate=np.ones(chains), step_size=0.1, seconds=1.0, kernel="nuts")
    res = hmc.HMCResult(samples=samples, **fields)
    x = rng.normal(size=(4, 2)).astype("float32")
    f = samples[..., :2] @ x.T + samples[..., 2:]  # (chains, draws, N): kernel first, then bias
    n, m = draws, chains
    w = f.var(axis=1, ddof=1).mean(axis=0)
    b_over_n = f.mean(axis=1).var(axis=0, ddof=1)
    expected = ((m + 1) / m) * ((n - 1) / n * w + b_over_n) / w - (n - 1) / (m * n)
    np.testing.assert_allclose(res.r_hat_outputs(x)[:, 0], expected, rtol=1e-5)
    assert np.all(expected > 1.2)  # the offsets are visible: the check can fail
    same = hmc.HMCResult(samples=rng.normal(size=(chains, draws, 3)), **fields)
    assert np.all(same.r_hat_outputs(x) < 1.1)
