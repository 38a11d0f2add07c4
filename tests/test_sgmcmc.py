"""tfbnn.sgmcmc: the noise of one step, the cyclical schedule's formula, and the stationary distribution on a
Bayesian linear regression against its closed form (and the exact stationary law of the discretized chain)."""

import math
import os

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfbnn
from tfbnn import sgmcmc

N, SIGMA, TAU = 64, 0.5, 2.0


def _regression():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(N, 2)).astype("float32")
    y = (x @ np.float32([[1.0], [-0.5]]) + SIGMA * rng.normal(size=(N, 1))).astype("float32")
    precision = x.astype(np.float64).T @ x / SIGMA**2 + TAU * np.eye(2)       # A, the Hessian of U
    mean = np.linalg.solve(precision, x.astype(np.float64).T @ y[:, 0] / SIGMA**2)
    return x, y, precision, mean


def _loss(y, f):
    """The mean negative log-likelihood per example (up to a constant): U = N * loss + prior."""
    return tf.reduce_mean(tf.square(y - f)) / (2 * SIGMA**2)


def _model():
    return keras.Sequential([keras.Input((2,)), keras.layers.Dense(1, use_bias=False, kernel_initializer="zeros")])


def _chain(optimizer, x, y, steps):
    """``steps`` full-batch steps of ``optimizer`` in one tf.function; the kernel after each, ``(steps, 2)``."""
    model = _model()
    optimizer.build(model.trainable_variables)

    @tf.function
    def run():
        out = tf.TensorArray(tf.float32, size=steps)
        for i in tf.range(steps):
            with tf.GradientTape() as tape:
                loss = _loss(y, model(x))
            optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
            out = out.write(i, tf.reshape(model.trainable_variables[0], [-1]))
        return out.stack()

    return run().numpy().astype(np.float64)


def _batch_means_se(samples, batches=50):
    """Standard errors of the mean and of the covariance entries by batch means (autocorrelated draws)."""
    parts = np.array_split(samples, batches)
    means = np.stack([p.mean(0) for p in parts])
    centred = samples - samples.mean(0)
    covs = np.stack([np.einsum("ti,tj->ij", c, c) / len(c) for c in np.array_split(centred, batches)])
    return means.std(0, ddof=1) / math.sqrt(batches), covs.std(0, ddof=1) / math.sqrt(batches)


def test_one_step_noise_variance_is_2_lr_t_over_n_and_the_seed_repeats_it():
    variable = keras.Variable(np.zeros(200_000, "float32"))
    lr, n, temperature = 0.01, 100, 0.5
    steps = []
    for _ in range(2):
        variable.assign(np.zeros(200_000, "float32"))
        opt = sgmcmc.SGLD(lr, num_examples=n, temperature=temperature, seed=3)
        opt.apply_gradients([(tf.zeros(200_000), variable)])
        steps.append(variable.numpy().copy())
    np.testing.assert_array_equal(steps[0], steps[1])
    want = 2 * lr * temperature / n
    assert steps[0].var() == pytest.approx(want, rel=0.02)   # the estimate's relative sd: sqrt(2 / 2e5) = 0.3%
    assert abs(steps[0].mean()) < 5 * math.sqrt(want / 200_000)
    # SGHMC: the first velocity is the noise, of variance 2 alpha lr T / N.
    variable.assign(np.zeros(200_000, "float32"))
    opt = sgmcmc.SGHMC(lr, num_examples=n, momentum=0.8, temperature=temperature, seed=4)
    opt.apply_gradients([(tf.zeros(200_000), variable)])
    assert variable.numpy().var() == pytest.approx(2 * 0.2 * lr * temperature / n, rel=0.02)
    # The gradient step itself, with the Gaussian prior's tau theta / N: no noise at T = 0.
    variable.assign(np.ones(200_000, "float32"))
    sgmcmc.SGLD(lr, num_examples=n, temperature=0.0, prior_precision=3.0).apply_gradients(
        [(tf.fill([200_000], 2.0), variable)])
    np.testing.assert_allclose(variable.numpy(), 1 - lr * (2.0 + 3.0 / n), rtol=1e-6)


def test_the_cyclical_schedule_is_the_papers_formula_and_explores_without_noise():
    k_total, cycles, alpha0, beta = 103, 4, 0.3, 0.75
    schedule = sgmcmc.CyclicalSchedule(alpha0, k_total, cycles, exploration=beta)
    length = math.ceil(k_total / cycles)
    for k in range(1, k_total + 1):  # the paper's k is 1-based: our step k - 1
        r = ((k - 1) % length) / length
        assert float(schedule(k - 1)) == pytest.approx(alpha0 / 2 * (math.cos(math.pi * r) + 1), rel=1e-6)
        assert bool(schedule.sampling(k - 1)) == (r >= beta)
    variable = keras.Variable(np.zeros(1000, "float32"))
    opt = sgmcmc.SGLD(schedule, num_examples=10, seed=0)
    opt.apply_gradients([(tf.zeros(1000), variable)])   # step 0 explores: no noise
    np.testing.assert_array_equal(variable.numpy(), 0.0)
    assert keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(schedule)).get_config() == \
        schedule.get_config()
    with pytest.raises(ValueError, match="cycles"):
        sgmcmc.CyclicalSchedule(0.1, total_steps=3, cycles=5)


def test_full_batch_sgld_samples_its_exact_stationary_law_and_tends_to_the_posterior():
    """A linear Gaussian chain: theta' = theta - h A (theta - mu) + sqrt(2h) xi, h = lr / N, has the stationary
    law N(mu, (A - h A^2 / 2)^-1) exactly; as lr -> 0 that is the posterior N(mu, A^-1)."""
    x, y, precision, mean = _regression()
    lr = 0.05
    samples = _chain(sgmcmc.SGLD(lr, num_examples=N, prior_precision=TAU, seed=0), x, y, 100_000)[2_000:]
    se_mean, se_cov = _batch_means_se(samples)
    h = lr / N
    stationary = np.linalg.inv(precision - h * precision @ precision / 2)
    np.testing.assert_array_less(np.abs(samples.mean(0) - mean), 5 * se_mean)
    np.testing.assert_array_less(np.abs(np.cov(samples.T) - stationary), 5 * se_cov)
    # The discretization's bias, O(lr): here the chain's variances exceed the posterior's by hA/2 ~ 10%.
    posterior = np.linalg.inv(precision)
    assert np.all(np.diag(stationary) > 1.05 * np.diag(posterior))
    # At a small step size the chain samples the posterior itself, within Monte Carlo error and the bias.
    small = _chain(sgmcmc.SGLD(0.005, num_examples=N, prior_precision=TAU, seed=1), x, y, 100_000)[5_000:]
    se_mean, se_cov = _batch_means_se(small)
    np.testing.assert_array_less(np.abs(small.mean(0) - mean), 5 * se_mean)
    np.testing.assert_array_less(np.abs(np.cov(small.T) - posterior), 5 * se_cov + 0.02 * np.abs(posterior).max())


def test_sghmc_samples_the_posterior_at_a_small_step_size():
    x, y, precision, mean = _regression()
    samples = _chain(sgmcmc.SGHMC(0.002, num_examples=N, momentum=0.9, prior_precision=TAU, seed=2), x, y,
                     100_000)[5_000:]
    posterior = np.linalg.inv(precision)
    se_mean, se_cov = _batch_means_se(samples)
    np.testing.assert_array_less(np.abs(samples.mean(0) - mean), 5 * se_mean)
    np.testing.assert_array_less(np.abs(np.cov(samples.T) - posterior), 5 * se_cov + 0.01 * np.abs(posterior).max())


def test_cyclical_sghmc_trains_with_fit_collects_in_sampling_stages_and_predicts_saves_and_exports(tmp_path):
    x, y, precision, mean = _regression()
    steps = 4 * 200
    schedule = sgmcmc.CyclicalSchedule(0.05, total_steps=steps, cycles=4, exploration=0.5)
    model = _model()
    model.compile(sgmcmc.SGHMC(schedule, num_examples=N, prior_precision=TAU, seed=0), _loss)
    collector = sgmcmc.SampleCollector(burn_in=100, thin=4)
    # The data ten times over per epoch (40 minibatches of 16): fewer, longer epochs; the same mean loss.
    model.fit(np.tile(x, (10, 1)), np.tile(y, (10, 1)), batch_size=16, epochs=steps // 40, verbose=0,
              callbacks=[collector])
    posterior = collector.posterior()
    positions = ((posterior.steps - 1) % schedule.cycle_length) / schedule.cycle_length
    assert np.all(positions >= 0.5) and np.all(posterior.steps > 100) and np.all(np.diff(posterior.steps) >= 4)
    sd = np.sqrt(np.diag(np.linalg.inv(precision)))
    np.testing.assert_array_less(np.abs(posterior.mean() - mean), 3 * sd)
    # A sampler's spread, not an optimizer's point: the samples vary by about the posterior's scale.
    assert np.all(posterior.samples.std(0) > 0.3 * sd)
    res = tfbnn.predict(posterior, x[:5], num_samples=len(posterior.samples))
    np.testing.assert_allclose(res.mean[:, 0], x[:5] @ posterior.mean().astype("float32"), rtol=1e-4, atol=1e-5)
    path = os.path.join(tmp_path, "chain.npz")
    posterior.save(path)
    back = tfbnn.inference.load_posterior(path, model)
    np.testing.assert_array_equal(back.weight_draws(7), posterior.weight_draws(7))
    served = tf.saved_model.load(tfbnn.export.export(posterior, str(tmp_path / "served"), num_samples=7))
    np.testing.assert_allclose(served.summary(tf.constant(x[:5]))["mean"], tfbnn.predict(
        posterior, x[:5], num_samples=7).mean, rtol=1e-5, atol=1e-6)
    # The compiled model saves with its sampler and schedule.
    model.save(tmp_path / "model.keras")
    optimizer = keras.saving.load_model(tmp_path / "model.keras", custom_objects={"_loss": _loss}).optimizer
    assert isinstance(optimizer, sgmcmc.SGHMC) and optimizer.get_config()["num_examples"] == N
    with pytest.raises(ValueError, match="No samples were kept"):
        sgmcmc.SampleCollector(burn_in=10**6).posterior()


def test_bad_arguments_name_themselves():
    with pytest.raises(ValueError, match="num_examples"):
        sgmcmc.SGLD(0.1, num_examples=0)
    with pytest.raises(ValueError, match="temperature"):
        sgmcmc.SGLD(0.1, num_examples=10, temperature=-1.0)
    with pytest.raises(ValueError, match="momentum"):
        sgmcmc.SGHMC(0.1, num_examples=10, momentum=1.0)
    with pytest.raises(ValueError, match="thin"):
        sgmcmc.SampleCollector(thin=0)
    with pytest.raises(ValueError, match="samples of shape"):
        sgmcmc.SGMCMCPosterior(_model(), np.zeros((3, 5)))


def test_per_cycle_keeps_the_last_steps_of_each_sampling_stage_and_the_ensemble_predicts_as_the_posterior(tmp_path):
    x, y, _, _ = _regression()
    # 2 cycles of 20 steps; the sampling stage is positions 10..19 of each (exploration 0.5): 10 steps, so
    # 3 samples per cycle are 3 steps apart, ending at the cycle's last step: 0-based steps 13, 16, 19, 33, 36, 39.
    schedule = sgmcmc.CyclicalSchedule(0.05, total_steps=40, cycles=2, exploration=0.5)
    model = _model()
    model.compile(sgmcmc.SGHMC(schedule, num_examples=N, prior_precision=TAU, seed=0), _loss)
    collector = sgmcmc.SampleCollector(per_cycle=3)
    model.fit(x, y, batch_size=16, epochs=10, verbose=0, callbacks=[collector])  # 4 steps per epoch
    assert collector.steps == [14, 17, 20, 34, 37, 40]  # steps taken (the 0-based step + 1)
    posterior = collector.posterior()
    ensemble = posterior.to_ensemble()
    assert ensemble.num_members == 6
    # Each member holds its sample's weights; the ensemble's predictive is the posterior's over all 6 samples.
    for member, theta in zip(ensemble.members, posterior.samples):
        np.testing.assert_allclose(member.layers[-1].kernel.numpy()[:, 0], theta, rtol=1e-6)
    np.testing.assert_allclose(tfbnn.predict(ensemble, x[:5], num_samples=1).mean,
                               tfbnn.predict(posterior, x[:5], num_samples=6).mean, rtol=1e-5, atol=1e-6)
    ensemble.save(tmp_path / "ensemble.keras")
    back = keras.saving.load_model(tmp_path / "ensemble.keras")  # uncompiled members: no loss to look up
    np.testing.assert_allclose(back.predict(x[:5], verbose=0), ensemble.predict(x[:5], verbose=0), rtol=1e-6)
    plain = _model()
    plain.compile(sgmcmc.SGLD(0.01, num_examples=N), _loss)
    with pytest.raises(ValueError, match="per_cycle=2"):
        plain.fit(x, y, epochs=1, verbose=0, callbacks=[sgmcmc.SampleCollector(per_cycle=2)])


def test_csgmcmc_is_a_method_that_training_run_samples_and_keeps_as_an_ensemble(tmp_path):
    from tfbnn import training

    recipe = training.get_recipe("digits-csgmcmc-mlp").replace(
        max_examples=160, max_test_examples=40, epochs=4, batch_size=32, learning_rate=0.05,
        method_options={"sampler": "sghmc", "cycles": 2, "samples_per_cycle": 2, "exploration": 0.5})
    optimizer = training.make_optimizer(recipe, steps_per_epoch=5, num_examples=160)
    assert isinstance(optimizer, sgmcmc.SGHMC) and optimizer.num_examples == 160 and optimizer.prior_precision == 1.0
    assert (optimizer.schedule.total_steps, optimizer.schedule.cycles, optimizer.schedule.exploration) == (20, 2, 0.5)
    with pytest.raises(ValueError, match="num_examples=None"):
        training.make_optimizer(recipe, steps_per_epoch=5)
    with pytest.raises(ValueError, match="weight_decay=0.1"):
        training.make_optimizer(recipe.replace(weight_decay=0.1), steps_per_epoch=5, num_examples=160)
    with pytest.raises(ValueError, match="sampler='adam'"):
        training.make_optimizer(recipe.replace(method_options={"sampler": "adam"}), 5, num_examples=160)
    # Under a distribution strategy (tfbnn train passes its default one), as the command runs it.
    with pytest.raises(ValueError, match=r"member_method'\]='csgmcmc'"):
        recipe.replace(method="ensemble", method_options={"members": 2, "member_method": "csgmcmc"})
    result = training.run(recipe, output_dir=str(tmp_path / "out"), verbose=0, strategy=tf.distribute.get_strategy())
    ensemble = result.model
    assert isinstance(ensemble, tfbnn.DeepEnsemble) and ensemble.num_members == 4  # 2 cycles x 2 samples
    assert result.test["num_samples"] == 4
    kernels = np.stack([m.layers[-1].kernel.numpy() for m in ensemble.members])
    assert np.all(np.std(kernels, axis=0).mean() > 0)  # four different samples, not one point four times
    back = keras.saving.load_model(tmp_path / "out" / "model.keras")
    assert isinstance(back, tfbnn.DeepEnsemble) and back.num_members == 4
    x = np.random.default_rng(0).random((6, *ensemble.members[0].input_shape[1:])).astype("float32")
    np.testing.assert_allclose(back.predict(x, verbose=0), ensemble.predict(x, verbose=0), rtol=1e-5, atol=1e-6)


def test_tfbnn_train_gives_csgmcmc_the_recipes_step_size_unless_told():
    from tfbnn import cli
    from tfbnn.cli import train as train_command

    parser = cli.build_parser()
    step = train_command.recipe_from_args(parser.parse_args(["train", "--method", "csgmcmc"])).learning_rate
    assert step == tfbnn.training.get_recipe("digits-csgmcmc-mlp").learning_rate == 0.1
    assert train_command.recipe_from_args(parser.parse_args(["train", "--method", "bbb"])).learning_rate == \
        tfbnn.training.get_recipe("digits-bbb-mlp").learning_rate
    assert train_command.recipe_from_args(parser.parse_args(
        ["train", "--method", "csgmcmc", "--learning-rate", "0.02"])).learning_rate == 0.02
