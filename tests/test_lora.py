"""tfbnn.lora: Laplace-LoRA against closed forms and NumPy definitions; variational LoRA (BLoB)."""

import contextlib
import copy
import os

import keras
import numpy as np
import pytest
import scipy.linalg
import scipy.special
import tensorflow as tf
import tensorflow_probability as tfp

import tfbnn
from tfbnn import lora

tfd = tfp.distributions
D, R, K = 3, 2, 2


def _lora_dense(units=K, d=D, rank=R, alpha=4, activation=None, seed=0, b_scale=0.5):
    """A one-layer LoRA model ``f = x (W0 + s A B)``, ``s = alpha / rank``, with random W0, A and B."""
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((d,)), keras.layers.Dense(units, use_bias=False, activation=activation)])
    layer = model.layers[0]
    layer.enable_lora(rank, lora_alpha=alpha)
    rng = np.random.default_rng(seed)
    layer.lora_kernel_b.assign(b_scale * rng.normal(size=(rank, units)).astype("float32"))
    return model, layer


def _data(n, d=D, seed=1):
    return np.random.default_rng(seed).normal(size=(n, d)).astype("float32")


def _weights(layer):
    as64 = lambda v: np.asarray(v.numpy(), np.float64)  # noqa: E731
    return as64(layer._kernel), as64(layer.lora_kernel_a), as64(layer.lora_kernel_b), layer.lora_alpha / layer.lora_rank


def _softmax(f):
    return scipy.special.softmax(f, axis=-1)


# -- Laplace-LoRA --------------------------------------------------------------------------------------
@pytest.mark.parametrize("hessian", lora.HESSIANS)
def test_laplace_lora_over_b_is_bayesian_linear_regression(hessian):
    """With ``A`` frozen, ``f(x) = x W0 + (s x A) B`` is linear in ``B``: on features ``u = s x A`` the model is
    a linear regression with the offset ``x W0``. The GGN is then the exact Hessian, ``N(B*, (U^T U / sigma^2 + delta
    I)^-1 kron I_K)`` the exact posterior (rows of ``B`` row-major), the Laplace evidence the exact one, and with
    ``Lambda = I / sigma^2`` constant KFAC (``A_f = U^T U``, ``G_f = I``) and the full GGN coincide. (With both
    factors free the model is bilinear: the GGN drops the second-order term and nothing is closed-form.)"""
    delta, sigma = 2.0, 0.3
    model, layer = _lora_dense()
    layer.lora_kernel_a.trainable = False
    x = _data(40)
    w0, a, _, s = _weights(layer)
    rng = np.random.default_rng(2)
    u = s * x @ a
    y = x @ w0 + u @ rng.normal(size=(R, K)) + sigma * rng.normal(size=(40, K))
    precision = u.T @ u / sigma**2 + delta * np.eye(R)
    b_map = np.linalg.solve(precision, u.T @ (y - x @ w0) / sigma**2)
    layer.lora_kernel_b.assign(b_map.astype("float32"))

    la = lora.fit_laplace(model, x, y, likelihood="regression", hessian=hessian, prior_precision=delta,
                          sigma_noise=sigma)
    full = np.kron(precision, np.eye(K))
    np.testing.assert_allclose(la.mean, b_map.ravel(), rtol=1e-5, atol=1e-6)
    expected = np.diag(full) if hessian == "diag" else full
    np.testing.assert_allclose(la.posterior_precision, expected, rtol=1e-5, atol=1e-6)

    if hessian != "diag":
        resid = y - x @ w0
        cov = sigma**2 * np.eye(len(x)) + u @ u.T / delta
        evidence = -0.5 * (K * (np.linalg.slogdet(cov)[1] + len(x) * np.log(2 * np.pi))
                           + np.einsum("nk,nk->", resid, np.linalg.solve(cov, resid)))
        # the Laplace evidence is computed at the float32 MAP: equal to float32 round-off
        np.testing.assert_allclose(la.log_marginal_likelihood(), evidence, rtol=1e-6)
        xt = _data(5, seed=3)
        ut = s * xt @ a
        pred = la.predict(xt)
        np.testing.assert_allclose(pred.mean, xt @ w0 + ut @ b_map, rtol=1e-4, atol=1e-5)
        std = np.sqrt(np.einsum("nr,rq,nq->n", ut, np.linalg.inv(precision), ut))
        np.testing.assert_allclose(pred.epistemic_std, np.repeat(std[:, None], K, 1), rtol=1e-4)
        # marginal likelihood tuning finds the exact evidence's maximum over delta (sigma fixed)
        grid = np.logspace(-2, 3, 201)
        best = grid[np.argmax([la.log_marginal_likelihood(g) for g in grid])]
        tuned = la.optimize_prior_precision(tune_sigma_noise=False).prior_precision
        assert abs(np.log(tuned) - np.log(best)) < np.log(grid[1] / grid[0])


def _np_lora_jacobian(x, w0, a, b, s):
    """``J_n = d f_n / d (vec A, vec B)`` (N, K, d r + r K) of ``f = x (W0 + s A B)``, written out."""
    n, d = x.shape
    r, k = b.shape
    ja = s * np.einsum("ni,jk->nkij", x, b).reshape(n, k, d * r)  # d f_k / d A_ij = s x_i B_jk
    jb = s * np.einsum("nj,kl->nkjl", x @ a, np.eye(k)).reshape(n, k, r * k)  # d f_k / d B_jl = s u_j [k = l]
    return np.concatenate([ja, jb], axis=-1)


@pytest.mark.parametrize("likelihood", ["regression", "classification"])
def test_laplace_lora_structures_match_their_numpy_definitions(likelihood):
    """Both factors free: the full GGN ``sum J^T Lambda J``, its diagonal, and KFAC per factor (``A_f = sum a a^T``,
    ``G_f = mean_n sum_k g g^T``: for ``A`` ``a = x``, ``g = s B L e_k``; for ``B`` ``a = s x A``, ``g = L e_k``,
    ``L L^T = Lambda``) from the written-out Jacobian of ``f = x (W0 + s A B)``."""
    model, layer = _lora_dense(units=3)
    x = _data(12)
    w0, a, b, s = _weights(layer)
    f = x @ (w0 + s * a @ b)
    if likelihood == "regression":
        lam = np.broadcast_to(np.eye(3), (len(x), 3, 3))
        y = f + 0.1
    else:
        p = _softmax(f)
        lam = np.einsum("nk,kl->nkl", p, np.eye(3)) - np.einsum("nk,nl->nkl", p, p)
        y = np.arange(len(x)) % 3
    jac = _np_lora_jacobian(x, w0, a, b, s)
    ggn = np.einsum("nkp,nkl,nlq->pq", jac, lam, jac)
    fits = {h: lora.fit_laplace(model, x, y, likelihood=likelihood, hessian=h) for h in lora.HESSIANS}
    np.testing.assert_allclose(fits["full"].hessian_factors, ggn, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(fits["diag"].hessian_factors, np.diag(ggn), rtol=1e-4, atol=1e-6)
    a_in, g_a, b_in, g_b = fits["kron"].hessian_factors
    u = s * x @ a
    np.testing.assert_allclose(a_in, x.T @ x, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(g_a, s**2 * np.einsum("jk,nkl,il->ji", b, lam, b) / len(x), rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(b_in, u.T @ u, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(g_b, lam.mean(axis=0), rtol=1e-4, atol=1e-6)
    # the KFAC posterior precision is block-diagonal, (A_f kron G_f) / sigma^2 + delta I per factor
    blocks = scipy.linalg.block_diag(np.kron(a_in, g_a), np.kron(b_in, g_b))
    np.testing.assert_allclose(fits["kron"].posterior_precision, blocks + np.eye(len(blocks)), rtol=1e-5, atol=1e-6)


def _sequence_model(length, seed=0):
    """EinsumDense over tokens ``btd,de->bte`` (LoRA rank 2), flattened, then a Dense head (no LoRA)."""
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((length, 4))
    proj = keras.layers.EinsumDense("btd,de->bte", output_shape=(length, 3))
    outputs = keras.layers.Dense(2)(keras.layers.Flatten()(proj(inputs)))
    model = keras.Model(inputs, outputs)
    proj.enable_lora(2)
    proj.lora_kernel_b.assign(np.random.default_rng(seed).normal(size=(2, 3)).astype("float32"))
    return model, proj


def test_kfac_over_tokens_of_an_einsum_dense():
    """KFAC "expand" over S = 3 positions against its definition: ``A_f = sum_{n,t} a a^T``, ``G_f = 1/(N S) sum_{n,t,k}
    g g^T`` with ``d f_k / d y_t = W_head[t, :, k]`` (regression, ``Lambda = I``); and for one example at one
    position KFAC is the exact GGN block (``H = a a^T kron g g^T``)."""
    model, proj = _sequence_model(3)
    x = np.random.default_rng(4).normal(size=(6, 3, 4)).astype("float32")
    y = np.zeros((6, 2), "float32")
    _, a, b, s = _weights(proj)
    head = np.asarray(model.layers[-1].kernel.numpy(), np.float64).reshape(3, 3, 2)  # (t, e, k)
    a_in, g_a, b_in, g_b = lora.fit_laplace(model, x, y, "regression", "kron").hessian_factors
    xs = x.reshape(-1, 4).astype(np.float64)
    g_out = np.einsum("tek,tfk->ef", head, head) / 3  # (1 / S) sum_t W_t W_t^T
    np.testing.assert_allclose(a_in, xs.T @ xs, rtol=1e-5)
    np.testing.assert_allclose(g_a, s**2 * b @ g_out @ b.T, rtol=1e-4)
    np.testing.assert_allclose(b_in, s**2 * (xs @ a).T @ (xs @ a), rtol=1e-4)
    np.testing.assert_allclose(g_b, g_out, rtol=1e-4)

    model1, _ = _sequence_model(1)
    x1, y1 = x[:1, :1], y[:1]
    kron = lora.fit_laplace(model1, x1, y1, "classification", "kron", prior_precision=0.5).posterior_precision
    full = lora.fit_laplace(model1, x1, y1, "classification", "full", prior_precision=0.5).posterior_precision
    size_a = 4 * 2
    np.testing.assert_allclose(kron[:size_a, :size_a], full[:size_a, :size_a], rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(kron[size_a:, size_a:], full[size_a:, size_a:], rtol=1e-4, atol=1e-6)


def test_laplace_lora_rejects_bad_input():
    plain = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    with pytest.raises(ValueError, match="without LoRA layers"):
        lora.LoRALaplace(plain)
    model, layer = _lora_dense()
    with pytest.raises(ValueError, match="hessian='block'"):
        lora.LoRALaplace(model, hessian="block")
    layer.lora_kernel_a.trainable = layer.lora_kernel_b.trainable = False
    with pytest.raises(ValueError, match="every LoRA factor frozen"):
        lora.LoRALaplace(model)
    inputs = keras.Input((5, 4))
    heads = keras.layers.EinsumDense("btd,dhe->bthe", output_shape=(5, 2, 3))
    model = keras.Model(inputs, keras.layers.Dense(2)(keras.layers.Flatten()(heads(inputs))))
    heads.enable_lora(2)
    with pytest.raises(ValueError, match="'btd,dhe->bthe'"):
        lora.LoRALaplace(model, hessian="kron")
    with pytest.raises(ValueError, match="prior_precision=-1"):
        lora.LoRALaplace(model, hessian="diag", prior_precision=-1)


# -- variational LoRA --------------------------------------------------------------------------------
def _variational(seed=0, kl_weight=0.01, prior=None):
    model, layer = _lora_dense(units=2, activation=None, seed=seed)
    bayes = lora.variational(model, kl_weight=kl_weight, seed=seed, prior=prior)
    return bayes, bayes.layers[-1]


def test_variational_lora_kl_matches_tfp():
    _, layer = _variational(prior=tfbnn.priors.Normal(0.3, 0.5))
    rng = np.random.default_rng(0)
    layer.rho.assign(rng.normal(size=layer.rho.shape).astype("float32"))
    loc = layer.layer.lora_kernel_a
    q = tfd.Normal(loc, tf.nn.softplus(layer.rho) + 1e-6)
    expected = tf.reduce_sum(tfd.kl_divergence(q, tfd.Normal(0.3, 0.5)))
    np.testing.assert_allclose(layer.kl_divergence(), expected, rtol=1e-5)


def test_variational_lora_samples_have_the_posterior_moments():
    """Draws of A have mean M and std sigma; the outputs of T joint samples at a fixed x have mean ``x W_M`` and
    covariance ``s^2 B^T diag(sum_i x_i^2 sigma_ij^2) B``, the law of ``s x (sigma eps) B``."""
    bayes, layer = _variational()
    layer.rho.assign(np.full(layer.rho.shape, -1.0, "float32"))
    sigma = np.log1p(np.exp(-1.0)) + 1e-6
    t = 20000
    draws = layer.sample_a(t).numpy()
    m = layer.layer.lora_kernel_a.numpy()
    np.testing.assert_allclose(draws.mean(0), m, atol=5 * sigma / np.sqrt(t))
    np.testing.assert_allclose(draws.std(0), sigma, rtol=0.03)
    x = _data(1)
    w0, a, b, s = _weights(layer.layer)
    with tfbnn.weight_samples(bayes, t, joint=True):
        out = bayes(np.repeat(x, t, 0), training=False).numpy()
    np.testing.assert_allclose(out.mean(0), (x @ (w0 + s * a @ b))[0], atol=5 * out.std(0).max() / np.sqrt(t))
    cov = s**2 * b.T @ np.diag((x[0] ** 2).sum() * sigma**2 * np.ones(R)) @ b
    np.testing.assert_allclose(np.cov(out.T), cov, rtol=0.05, atol=0.02 * np.abs(cov).max())
    assert len(np.unique(out[:, 0])) > 0.99 * t  # distinct draws (up to float32 ties), not one repeated


def test_variational_lora_loss_is_the_elbo():
    """``train_on_batch``'s loss is ``mean (y - f_A(x))^2 + kl_weight * KL``, A drawn from the same seed state."""
    bayes, layer = _variational(kl_weight=0.05)
    layer.rho.assign(np.full(layer.rho.shape, -2.0, "float32"))
    bayes.compile(keras.optimizers.SGD(0.0), "mse")
    x, y = _data(8), np.ones((8, 2), "float32")
    state = layer.seed_generator.state.numpy()
    a_draw = layer.sample_a(1).numpy()[0]  # the draw the next call makes
    layer.seed_generator.state.assign(state)
    w0, _, b, s = _weights(layer.layer)
    sigma = np.log1p(np.exp(-2.0)) + 1e-6
    m = layer.layer.lora_kernel_a.numpy().astype(np.float64)
    kl = np.sum(np.log(1.0 / sigma) + (sigma**2 + m**2) / 2 - 0.5)
    expected = np.mean((y - x @ (w0 + s * a_draw @ b)) ** 2) + 0.05 * kl
    np.testing.assert_allclose(bayes.train_on_batch(x, y), expected, rtol=1e-5)


def test_variational_lora_trains_predicts_and_saves(tmp_path):
    bayes, layer = _variational(kl_weight=None, seed=3)
    w0 = layer.layer._kernel.numpy().copy()
    m0, rho0 = layer.layer.lora_kernel_a.numpy().copy(), layer.rho.numpy().copy()
    x = _data(32)
    y = x[:, :2] * 2.0
    bayes.compile(keras.optimizers.Adam(0.05), "mse")
    with pytest.raises(ValueError, match="kl_weight=None"):
        bayes.fit(x, y, epochs=1, verbose=0)
    tfbnn.set_kl_weight(bayes, 1.0 / len(x))
    bayes.compile(keras.optimizers.Adam(0.05), "mse")  # a fresh train step after the failed trace
    history = bayes.fit(x, y, epochs=5, batch_size=16, verbose=0).history["loss"]
    assert history[-1] < history[0]
    np.testing.assert_array_equal(layer.layer._kernel.numpy(), w0)  # W0 stays frozen
    assert not np.allclose(layer.layer.lora_kernel_a.numpy(), m0) and not np.allclose(layer.rho.numpy(), rho0)

    res = tfbnn.predict(bayes, x[:4], num_samples=16, task="regression")
    assert res.mean.shape == (4, 2) and np.all(res.epistemic_std > 0)
    with tfbnn.posterior_mean(bayes):
        np.testing.assert_allclose(bayes(x[:4]), layer.layer(x[:4]), rtol=1e-6, atol=1e-6)

    path = os.path.join(tmp_path, "blob.keras")
    bayes.save(path)
    loaded = keras.models.load_model(path)
    np.testing.assert_array_equal(loaded(x[:4]), bayes(x[:4]))  # the seed state travels: equal draws
    np.testing.assert_array_equal(loaded(x[:4]), bayes(x[:4]))
    config = loaded.layers[-1].get_config()
    assert config["seed"] == 3 and config["layer"]["config"]["lora_rank"] == R



def test_variational_lora_exports_its_predictive(tmp_path):
    bayes, _ = _variational(kl_weight=0.01, seed=3)
    x = _data(4)
    served = tf.saved_model.load(tfbnn.export.export(bayes, os.path.join(tmp_path, "sm"), num_samples=8,
                                                     task="regression"))
    summary = served.summary(tf.constant(x[:4]))
    assert summary["mean"].shape == (4, 2) and np.all(summary["epistemic_std"].numpy() > 0)
    with tfbnn.posterior_mean(bayes):
        np.testing.assert_allclose(served.mean(tf.constant(x[:4])), bayes(x[:4]), rtol=1e-5)


def test_variational_lora_on_einsum_dense_samples_per_block():
    inputs = keras.Input((3, 4))
    proj = keras.layers.EinsumDense("btd,de->bte", output_shape=(3, 5), bias_axes="e")
    model = keras.Model(inputs, proj(inputs))
    proj.enable_lora(2)
    proj.lora_kernel_b.assign(np.ones((2, 5), "float32"))
    bayes = lora.variational(model, kl_weight=0.0, seed=1)
    layer = bayes.layers[-1]
    layer.rho.assign(np.zeros(layer.rho.shape, "float32"))
    x = np.random.default_rng(0).normal(size=(2, 3, 4)).astype("float32")
    with tfbnn.posterior_mean(bayes):
        np.testing.assert_allclose(bayes(x), proj(x), rtol=1e-6, atol=1e-6)
    with tfbnn.weight_samples(bayes, 4, joint=True):
        out = bayes(np.tile(x, (4, 1, 1))).numpy().reshape(4, 2, 3, 5)
    # each block shares its A: its deviation from the mean is x (sigma eps_t) B s, different across blocks
    assert len({round(float(v), 5) for v in out[:, 0, 0, 0]}) == 4
    state = layer.seed_generator.state.numpy()
    a_draws = layer.sample_a(4).numpy()
    layer.seed_generator.state.assign(state)
    with tfbnn.weight_samples(bayes, 4, joint=True):
        out = bayes(np.tile(x, (4, 1, 1))).numpy().reshape(4, 2, 3, 5)
    s = proj.lora_alpha / proj.lora_rank
    for t in range(4):
        kernel = proj._kernel.numpy() + s * a_draws[t] @ proj.lora_kernel_b.numpy()
        # float32 round-off of two summation orders; a draw other than A_t would differ by O(sigma) ~ 0.7
        np.testing.assert_allclose(out[t], np.einsum("btd,de->bte", x, kernel) + proj.bias.numpy(), rtol=1e-4,
                                   atol=1e-4)


def test_variational_lora_rejects_bad_input():
    with pytest.raises(ValueError, match="without LoRA"):
        lora.VariationalLoRA(keras.layers.Dense(2))
    with pytest.raises(ValueError, match="type Conv1D"):
        lora.VariationalLoRA(keras.layers.Conv1D(2, 3))
    with pytest.raises(ValueError, match="prior=.*ScaleMixture"):
        lora.VariationalLoRA(keras.layers.Dense(2, lora_rank=1), prior=tfbnn.priors.ScaleMixture(0.5, 1.0, 0.01))
    with pytest.raises(ValueError, match="kl_weight"):
        lora.VariationalLoRA(keras.layers.Dense(2, lora_rank=1), kl_weight=-1.0)
    with pytest.raises(ValueError, match="without LoRA layers"):
        lora.variational(keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)]))
    # issue 36: raw TensorFlow errors before
    with pytest.raises(ValueError, match="Expected `lora_rank` to be a positive integer. Received: lora_rank=-1"):
        lora.VariationalLoRA(keras.layers.Dense(2, lora_rank=-1))
    bayes, layer = _variational()
    with pytest.raises(ValueError, match="Received: num_samples=0"):
        layer.sample_a(0)
    with pytest.raises(ValueError, match=f"of layer '{layer.name}' is incompatible .* value 3, but received input with "
                                         r"shape \(2, 4\)"):
        layer(np.ones((2, 4), "float32"))
    with pytest.raises(ValueError, match="Expected `seed` to be an integer .*Received: seed='a'"):
        lora.variational(_lora_dense()[0], seed="a")


def _tiny_lora_bert(dropout=0.1):
    """A tiny KerasHub BERT classifier (seeded) after ``backbone.enable_lora(2)``: LoRA on the query and value
    EinsumDense projections nested in its attention layers (3-D kernels)."""
    keras_hub = pytest.importorskip("keras_hub")
    keras.utils.set_random_seed(0)
    backbone = keras_hub.models.BertBackbone(vocabulary_size=30, num_layers=1, num_heads=2, hidden_dim=8,
                                             intermediate_dim=16, max_sequence_length=6, dropout=dropout)
    classifier = keras_hub.models.BertTextClassifier(backbone, num_classes=2, preprocessor=None, dropout=0.0)
    backbone.enable_lora(2)
    return classifier


def test_laplace_lora_on_a_kerashub_classifier():
    """A tiny BERT classifier with ``backbone.enable_lora(2)`` (query and value EinsumDense, 3-D kernels): the
    diagonal GGN over the LoRA factors equals ``sum_n diag(J_n^T Lambda_n J_n)`` from the Jacobian of the logits
    in the LoRA variables (taken here with a GradientTape), ``Lambda_n = diag(p_n) - p_n p_n^T``."""
    classifier = _tiny_lora_bert()
    for layer in lora.lora_layers(classifier):  # B = 0 after enable_lora: a nonzero adapter
        layer.lora_kernel_b.assign(np.full(layer.lora_kernel_b.shape, 0.3, "float32"))
    rng = np.random.default_rng(0)
    x = {"token_ids": rng.integers(0, 30, (6, 6)).astype("int32"), "segment_ids": np.zeros((6, 6), "int32"),
         "padding_mask": np.ones((6, 6), "int32")}
    y = rng.integers(0, 2, 6)
    la = lora.fit_laplace(classifier, x, y, hessian="diag")
    variables = [getattr(layer, f"lora_kernel_{w}") for layer, w in la.factors]
    with tf.GradientTape() as tape:
        logits = classifier(x, training=False)
    jac = np.concatenate([j.numpy().reshape(6, 2, -1) for j in tape.jacobian(logits, variables)], axis=-1)
    p = _softmax(logits.numpy().astype(np.float64))
    lam = np.einsum("nk,kl->nkl", p, np.eye(2)) - np.einsum("nk,nl->nkl", p, p)
    expected = np.einsum("nkp,nkl,nlp->p", jac, lam, jac)
    assert la.num_parameters == expected.size == sum(int(np.prod(v.shape)) for v in variables)
    np.testing.assert_allclose(la.hessian_factors, expected, rtol=1e-4, atol=1e-9)
    with pytest.raises(ValueError, match="hessian='kron' needs"):
        lora.LoRALaplace(classifier, hessian="kron")


# -- Laplace-LoRA as a Keras model: the linearized predictive -------------------------------------------
def _lora_mlp(units=K, seed=0):
    """``3 -> Dense(4, tanh) -> Dense(units)``, LoRA (rank 1) on both layers, with nonzero adapters."""
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((D,)), keras.layers.Dense(4, activation="tanh"), keras.layers.Dense(units)])
    rng = np.random.default_rng(seed)
    for layer in model.layers:
        layer.enable_lora(1, lora_alpha=2)
        layer.lora_kernel_b.assign(0.5 * rng.normal(size=layer.lora_kernel_b.shape).astype("float32"))
    return model


def _sampling_layer(sampler):
    return next(layer for layer in sampler.layers if isinstance(layer, lora.LinearizedLoRA))


def _lora_jacobian(model, variables, x):
    """``f(x; theta*)`` (N, K) and ``J = d f / d theta`` (N, K, P) by reverse mode (a GradientTape)."""
    with tf.GradientTape() as tape:
        f = model(x, training=False)
    parts = tape.jacobian(f, variables)
    return f.numpy().astype(np.float64), np.concatenate([j.numpy().reshape(f.shape[0], K, -1) for j in parts], -1)


@pytest.mark.parametrize("hessian", lora.HESSIANS)
def test_to_model_sample_is_the_linearized_network(hessian):
    """One call is ``f(x; theta*) + J(x) delta`` with ``J`` by reverse mode (independent of the layer's forward-mode
    JVP) and ``delta`` the draw :meth:`LinearizedLoRA.sample_offsets` gives a twin with the same seed; the draws'
    covariance is the posterior covariance: with T = 20000 Gaussian draws each entry of the sample covariance has
    the standard deviation sqrt((S_ii S_jj + S_ij^2) / T), and every entry must lie within 5 of them."""
    model = _lora_mlp()
    x = _data(40)
    la = lora.fit_laplace(model, x, (x[:, 0] > 0).astype("int32"), hessian=hessian, prior_precision=0.5)
    sampler, twin = la.to_model(seed=3), la.to_model(seed=3)
    delta = _sampling_layer(twin).sample_offsets(1).numpy()[0].astype(np.float64)
    f, jac = _lora_jacobian(model, [getattr(layer, f"lora_kernel_{w}") for layer, w in la.factors], x[:5])
    assert not np.allclose(jac @ delta, 0.0, atol=1e-3)
    np.testing.assert_allclose(sampler(x[:5]), f + jac @ delta, rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(sampler(x[:5]), twin(x[:5]))  # the twin's next draw is the sampler's

    draws = _sampling_layer(sampler).sample_offsets(20000).numpy().astype(np.float64)
    cov = la.posterior_covariance if hessian != "diag" else np.diag(la.posterior_covariance)
    sd = np.sqrt((np.outer(np.diag(cov), np.diag(cov)) + cov**2) / len(draws))
    assert np.all(np.abs(np.cov(draws, rowvar=False) - cov) <= 5 * sd + 1e-7)


def test_to_model_regression_predict_has_the_glm_moments():
    """``tfbnn.predict`` on the regression sampler (vectorized: one delta per block of the tiled batch): the Monte
    Carlo mean and covariance of T = 3000 function draws match ``function_moments`` (mean within 5 standard errors
    sqrt(var / T); each covariance entry within 5 of its sample sd sqrt((S_kk S_ll + S_kl^2) / T)), and the
    aleatoric std is ``sigma_noise`` through the GaussianHead."""
    model = _lora_mlp()
    x = _data(40)
    y = np.tanh(x[:, :2]) + 0.1 * np.random.default_rng(3).normal(size=(40, 2))
    la = lora.fit_laplace(model, x, y, likelihood="regression", hessian="kron", sigma_noise=0.3)
    la.prior_precision = 0.05  # a wide posterior: a clear epistemic part
    f_mu, f_var = la.function_moments(x[:3])
    num = 3000
    res = tfbnn.predict(la.to_model(seed=1), x[:3], num_samples=num, return_samples=True)
    np.testing.assert_allclose(res.aleatoric_std, 0.3, rtol=1e-6)
    draws = res.samples[..., :K].astype(np.float64)  # (T, N, K) the means; the head's scales follow
    assert np.all(np.abs(draws.mean(axis=0) - f_mu) <= 5 * np.sqrt(np.diagonal(f_var, axis1=1, axis2=2) / num))
    centered = draws - draws.mean(axis=0)
    cov = np.einsum("tnk,tnl->nkl", centered, centered) / (num - 1)
    diag = np.diagonal(f_var, axis1=1, axis2=2)
    sd = np.sqrt((np.einsum("nk,nl->nkl", diag, diag) + f_var**2) / num)
    assert np.all(np.abs(cov - f_var) <= 5 * sd)
    np.testing.assert_allclose(res.epistemic_std, np.sqrt(diag), rtol=0.1)


def test_to_model_classifier_predict_and_calibration_metrics():
    """A softmax classifier's sampler: ``tfbnn.predict`` agrees with the GLM Monte Carlo predictive of
    ``LoRALaplace.predict`` (within 5 Monte Carlo standard errors of the T = 2000 samples, plus 0.01 for its own 20000
    samples), its epistemic part is positive, NLL and ECE run on it, and the mean mode is the MAP network."""
    model = _lora_mlp(units=3)
    model.layers[-1].activation = keras.activations.softmax
    x = _data(40)
    y = np.digitize(x[:, 0], [-0.5, 0.5])
    la = lora.fit_laplace(model, x, y, hessian="diag", prior_precision=0.1)
    sampler = la.to_model(seed=2)
    res = tfbnn.predict(sampler, x[:6], num_samples=2000, return_samples=True)
    glm = la.predict(x[:6], link_approx="mc", num_samples=20000, seed=0)
    se = res.samples.std(axis=0) / np.sqrt(2000)
    assert np.all(np.abs(res.mean_probs - glm) <= 5 * se + 0.01)
    assert np.all(res.mutual_information > 0)
    nll = tfbnn.metrics.negative_log_likelihood(res.mean_probs, y[:6])
    ece = tfbnn.metrics.expected_calibration_error(res.mean_probs, y[:6])
    assert np.isfinite(nll) and 0.0 <= ece <= 1.0
    with tfbnn.posterior_mean(sampler):
        np.testing.assert_allclose(sampler(x[:6]), model(x[:6]), atol=1e-6)


def _kron_classifier_sampler():
    model = _lora_mlp()
    x = _data(40)
    return model, x, lora.fit_laplace(model, x, (x[:, 0] > 0).astype("int32"), hessian="kron").to_model(seed=4)


def test_to_model_saves_and_loads(tmp_path):
    """``.keras``: ``W0``, the bias, ``A``, ``B`` (with ``lora_alpha = 2 != rank``) and the posterior root come back
    exactly (Keras alone would save ``W0 + s A B``, zero ``A`` and ``B``, and rebuild ``alpha = rank``), the seed
    state too (equal draws), and the user's model still saves as Keras does."""
    model, x, sampler = _kron_classifier_sampler()
    path = os.path.join(tmp_path, "lora.keras")
    sampler.save(path)
    assert not any("save_own_variables" in vars(layer) for layer in model.layers)  # one-shot: Keras' own again
    loaded = keras.saving.load_model(path)
    assert [v.name for v in loaded.weights] == [v.name for v in sampler.weights]
    for a, b in zip(sampler.weights, loaded.weights):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    np.testing.assert_array_equal(loaded(x[:4]), sampler(x[:4]))
    with tfbnn.posterior_mean(sampler), tfbnn.posterior_mean(loaded):
        np.testing.assert_array_equal(loaded(x[:4]), sampler(x[:4]))
        np.testing.assert_allclose(sampler(x[:4]), model(x[:4]), atol=1e-6)


def test_to_model_exports(tmp_path):
    """SavedModel: ``mean`` is the MAP network's logits, ``sample_seeded(x, s)`` the draw of the in-memory model
    reseeded to ``[s, 0]`` (``tfbnn.export`` reseeds so), ``summary`` a classification summary with a positive
    epistemic part."""
    model, x, sampler = _kron_classifier_sampler()
    served = tf.saved_model.load(tfbnn.export.export(sampler, os.path.join(tmp_path, "sm"), num_samples=64,
                                                     from_logits=True))
    np.testing.assert_allclose(served.mean(tf.constant(x[:4])), model(x[:4]), atol=1e-6)
    layer = _sampling_layer(sampler)
    layer.seed_generator.state.assign(np.array([7, 0], layer.seed_generator.state.dtype))
    np.testing.assert_allclose(served.sample_seeded(tf.constant(x[:4]), tf.constant(7, tf.int64)), sampler(x[:4]),
                               rtol=1e-5, atol=1e-6)
    summary = served.summary(tf.constant(x[:4]))
    assert summary["mean_probs"].shape == (4, K) and np.all(summary["epistemic"].numpy() > 0)


def test_to_model_rejects_bad_input():
    model = _lora_mlp()
    x = _data(20)
    with pytest.raises(ValueError, match="not fitted"):
        lora.LoRALaplace(model, hessian="diag").to_model()
    la = lora.fit_laplace(model, x, (x[:, 0] > 0).astype("int32"), hessian="diag")
    with pytest.raises(ValueError, match="seed='a'"):
        la.to_model(seed="a")
    with pytest.raises(ValueError, match="name=3"):
        la.to_model(name=3)
    layer = _sampling_layer(la.to_model())
    with pytest.raises(ValueError, match="structure='dense'"):
        lora.LinearizedLoRA(layer.features, layer.last, layer.factors, layer.lora, structure="dense")
    with pytest.raises(ValueError, match="factors="):
        lora.LinearizedLoRA(layer.features, layer.last, [[0, "c"]], layer.lora)
    with pytest.raises(ValueError, match=r"lora=\[\[0, 1\]\]"):
        lora.LinearizedLoRA(layer.features, layer.last, layer.factors, [[0, 1]])
    with pytest.raises(ValueError, match="last of type Conv1D"):
        lora.LinearizedLoRA(layer.features, keras.layers.Conv1D(2, 1), layer.factors, layer.lora)
    with pytest.raises(ValueError, match="num_samples=0"):
        layer.sample_offsets(0)
    with pytest.raises(NotImplementedError, match="to_model"):
        la.save("la.npz")
    # issue 36: a negative seed was accepted; NumPy integers are seeds too
    with pytest.raises(ValueError, match=r"Expected `seed` to be an integer in \[0, 2\^31\).*Received: seed=-1"):
        la.to_model(seed=-1)
    assert _sampling_layer(la.to_model(seed=np.int64(3))).seed == 3
    with pytest.raises(ValueError, match=r"Expected inputs of shape \[\(None, 3\)\].*Received: x of shape \[\(20, 4\)\]"):
        lora.fit_laplace(model, np.ones((20, 4), "float32"), (x[:, 0] > 0).astype("int32"), hessian="kron")
    with pytest.raises(ValueError, match=r"Received: x of shape \[\(20,\)\]"):
        lora.fit_laplace(model, x[:, 0], (x[:, 0] > 0).astype("int32"), hessian="diag")
    with pytest.raises(ValueError, match=r"Expected LoRA ranks >= 1 .*Received: lora=\[\[0, 0, 1.0\]"):
        lora.LinearizedLoRA(layer.features, layer.last, layer.factors, [[0, 0, 1.0], [1, 1, 2.0]])
    with pytest.raises(ValueError, match=r"indices of `factors` among those of `lora`.*factors=\[\[7, 'a'\]\]"):
        lora.LinearizedLoRA(layer.features, layer.last, [[7, "a"]], layer.lora)
    with pytest.raises(ValueError, match=r"`lora` indices in \[0, 2\).*lora=\[\[7, 1, 2.0\]\]"):
        lora.LinearizedLoRA(layer.features, layer.last, [[7, "a"]], [[7, 1, 2.0]])
    with pytest.raises(ValueError, match="Expected a Keras model or layer. Received: model of type int"):
        lora.lora_layers(3)


def test_to_model_on_a_kerashub_classifier(tmp_path):
    """A tiny BERT with ``backbone.enable_lora(2)`` (LoRA on EinsumDense projections nested in KerasHub's blocks):
    the sampler's draw is ``f + J delta`` (``J`` by a GradientTape), ``tfbnn.predict`` runs (logits), and the
    ``.keras`` round trip, whose backbone is rebuilt from its constructor without LoRA, gives the same draws."""
    classifier = _tiny_lora_bert()
    for layer in lora.lora_layers(classifier):
        layer.lora_kernel_b.assign(np.full(layer.lora_kernel_b.shape, 0.3, "float32"))
    rng = np.random.default_rng(0)
    x = {"token_ids": rng.integers(0, 30, (6, 6)).astype("int32"), "segment_ids": np.zeros((6, 6), "int32"),
         "padding_mask": np.ones((6, 6), "int32")}
    la = lora.fit_laplace(classifier, x, rng.integers(0, 2, 6), hessian="diag", prior_precision=0.5)
    sampler, twin = la.to_model(seed=1), la.to_model(seed=1)
    delta = _sampling_layer(twin).sample_offsets(1).numpy()[0].astype(np.float64)
    f, jac = _lora_jacobian(classifier, [getattr(layer, f"lora_kernel_{w}") for layer, w in la.factors], x)
    np.testing.assert_allclose(sampler(x), f + jac @ delta, rtol=1e-4, atol=1e-5)
    res = tfbnn.predict(sampler, x, num_samples=8, from_logits=True)
    assert res.mean_probs.shape == (6, 2) and np.all(res.mutual_information > 0)
    path = os.path.join(tmp_path, "bert_lora.keras")
    sampler.save(path)
    loaded = keras.saving.load_model(path)
    np.testing.assert_array_equal(loaded(x), sampler(x))


# -- variational LoRA on nested LoRA layers (VariationalLoRAModel) -----------------------------------
def _nested(seed=0, dropout=0.0, hidden=3):
    """``x -> [Dense(hidden, tanh, LoRA) -> Dropout] -> Dense(K)``: the LoRA layer one level down (a Sequential
    inside a Sequential), ``W0``, ``A`` and ``B`` random."""
    keras.utils.set_random_seed(seed)
    inner = keras.Sequential([keras.Input((D,)), keras.layers.Dense(hidden, activation="tanh"),
                              keras.layers.Dropout(dropout, seed=seed)], name="inner")
    model = keras.Sequential([keras.Input((D,)), inner, keras.layers.Dense(K)], name="outer")
    layer = inner.layers[0]
    layer.enable_lora(R, lora_alpha=4)
    rng = np.random.default_rng(seed)
    layer.lora_kernel_b.assign(0.5 * rng.normal(size=(R, hidden)).astype("float32"))
    return model, layer


def _nested_forward(model, layer, a):
    """The nested model's logits in NumPy (float64) with ``A = a``."""
    w0, _, b, s = _weights(layer)
    head = model.layers[-1]
    as64 = lambda v: np.asarray(v.numpy(), np.float64)  # noqa: E731
    return lambda x: np.tanh(x @ (w0 + s * a @ b) + as64(layer.bias)) @ as64(head.kernel) + as64(head.bias)


def test_variational_lora_model_kl_matches_tfp():
    model, layer = _nested()
    bayes = lora.variational(model, prior=tfbnn.priors.Normal(0.3, 0.5), kl_weight=0.01, seed=0)
    assert isinstance(bayes, lora.VariationalLoRAModel) and bayes.adapter_layers == [layer]
    rho = bayes.posterior.rhos[0]
    rho.assign(np.random.default_rng(0).normal(size=rho.shape).astype("float32"))
    q = tfd.Normal(layer.lora_kernel_a, tf.nn.softplus(rho) + 1e-6)
    np.testing.assert_allclose(bayes.kl_divergence(), tf.reduce_sum(tfd.kl_divergence(q, tfd.Normal(0.3, 0.5))),
                               rtol=1e-5)
    np.testing.assert_allclose(bayes.a_scales()[0], tf.nn.softplus(rho) + 1e-6, rtol=1e-6)
    assert tfbnn.bayesian_layers(bayes) == [bayes.posterior]  # what KLAnnealing and set_kl_weight find


def test_variational_lora_model_loss_is_the_elbo():
    """``train_on_batch``'s loss is ``mean CE(y, f_A(x)) + kl_weight * KL`` with ``f_A`` the nested model in NumPy at
    the draw ``A`` made from the same seed state, the KL ``tfd.kl_divergence`` summed."""
    model, layer = _nested()
    bayes = lora.variational(model, kl_weight=0.05, seed=1)
    bayes.posterior.rhos[0].assign(np.full((D, R), -1.0, "float32"))
    bayes.compile(keras.optimizers.SGD(0.0), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    x, y = _data(8), np.arange(8) % K
    state = bayes.posterior.seed_generator.state.numpy()
    a_draw = np.asarray(bayes.sample_a()[0][0], np.float64)  # the draw the next call makes
    bayes.posterior.seed_generator.state.assign(state)
    logits = _nested_forward(model, layer, a_draw)(x.astype(np.float64))
    nll = -np.mean(np.log(_softmax(logits)[np.arange(8), y]))
    q = tfd.Normal(tf.cast(layer.lora_kernel_a, tf.float64), np.log1p(np.exp(-1.0)) + 1e-6)
    kl = float(tf.reduce_sum(tfd.kl_divergence(q, tfd.Normal(np.float64(0), np.float64(1)))))
    assert abs(a_draw - layer.lora_kernel_a.numpy()).max() > 0.05  # a real draw, not the mean
    np.testing.assert_allclose(bayes.train_on_batch(x, y), nll + 0.05 * kl, rtol=1e-5)


def test_variational_lora_model_sigma_zero_is_the_lora_model_and_seeded_draws_repeat():
    model, _ = _nested()
    x = _data(4)
    plain = model(x).numpy()
    bayes = lora.VariationalLoRAModel(model, rho_initializer=keras.initializers.Constant(-30.0), seed=2)
    np.testing.assert_allclose(bayes(x), plain, rtol=1e-6, atol=1e-6)  # sigma = softplus(-30) + 1e-6
    wide = [lora.VariationalLoRAModel(model, rho_initializer=keras.initializers.Constant(0.0), seed=2)
            for _ in range(2)]
    first, second = wide[0](x).numpy(), wide[0](x).numpy()
    assert np.abs(first - second).min() > 1e-4 and np.abs(first - plain).min() > 1e-4
    np.testing.assert_array_equal(wide[1](x), first)  # the same seed: the same draws
    np.testing.assert_array_equal(wide[1](x), second)
    with tfbnn.posterior_mean(wide[0]):
        np.testing.assert_allclose(wide[0](x), plain, rtol=1e-6, atol=1e-6)


def test_variational_lora_model_monte_carlo_blocks_use_their_own_draws():
    """Inside ``weight_samples(bayes, T)`` block ``t`` of the ``(T B, ...)`` rows is the NumPy forward at ``A_t`` of
    ``sample_a(T)`` from the same seed state, and the T blocks differ; ``tfbnn.predict`` gives T distinct samples."""
    model, layer = _nested()
    bayes = lora.VariationalLoRAModel(model, rho_initializer=keras.initializers.Constant(-1.0), seed=5)
    x = _data(2)
    state = bayes.posterior.seed_generator.state.numpy()
    draws = np.asarray(bayes.sample_a(3)[0], np.float64)
    bayes.posterior.seed_generator.state.assign(state)
    with tfbnn.weight_samples(bayes, 3):
        out = tf.function(lambda v: bayes(v))(np.tile(x, (3, 1))).numpy().reshape(3, 2, K)
    for t in range(3):
        np.testing.assert_allclose(out[t], _nested_forward(model, layer, draws[t])(x.astype(np.float64)),
                                   rtol=1e-5, atol=1e-5)
    assert np.abs(out[0] - out[1]).min() > 1e-4 and np.abs(out[1] - out[2]).min() > 1e-4
    samples = tfbnn.predict(bayes, x, num_samples=4, task="regression", return_samples=True).samples
    assert samples.shape == (4, 2, K) and len({tuple(np.round(v[0], 6)) for v in samples}) == 4


def test_variational_lora_model_fit_step_moves_m_rho_b_not_frozen_weights():
    model, layer = _nested()
    head = model.layers[-1]
    head.trainable = False
    bayes = lora.variational(model, kl_weight=0.01, seed=0)
    frozen = [layer._kernel.numpy().copy(), head.kernel.numpy().copy()]
    moving = [layer.lora_kernel_a, bayes.posterior.rhos[0], layer.lora_kernel_b]
    before = [v.numpy().copy() for v in moving]
    bayes.compile(keras.optimizers.SGD(0.1), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    bayes.fit(_data(8), np.arange(8) % K, batch_size=8, epochs=1, verbose=0)
    for variable, value in zip(moving, before):
        assert np.abs(variable.numpy() - value).max() > 1e-6, variable.path
    np.testing.assert_array_equal(layer._kernel.numpy(), frozen[0])
    np.testing.assert_array_equal(head.kernel.numpy(), frozen[1])


def test_variational_lora_model_applies_the_dropout_seed_updates():
    """The wrapped model's dropout seed state advances across calls (updates made inside the StatelessScope are
    applied after it), so two training calls with sigma ~ 0 differ by their dropout masks."""
    model, _ = _nested(dropout=0.5, hidden=16)
    bayes = lora.VariationalLoRAModel(model, rho_initializer=keras.initializers.Constant(-30.0), kl_weight=0.0,
                                      seed=0)
    dropout = model.layers[0].layers[-1]
    x = _data(4)
    states = [dropout.seed_generator.state.numpy()]
    outputs = []
    for _ in range(2):
        outputs.append(bayes(x, training=True).numpy())
        states.append(dropout.seed_generator.state.numpy())
    assert not np.array_equal(states[0], states[1]) and not np.array_equal(states[1], states[2])
    assert np.abs(outputs[0] - outputs[1]).max() > 1e-3


def _nested_bayes():
    model, layer = _nested()
    bayes = lora.variational(model, kl_weight=0.01, seed=4)
    bayes.posterior.rhos[0].assign(np.full((D, R), -1.0, "float32"))
    return bayes, layer


def test_variational_lora_model_saves(tmp_path):
    """``.keras``: rho and the unmerged A, B (alpha 4 with rank 2 restored), equal seeded draws and posterior means."""
    bayes, layer = _nested_bayes()
    x = _data(4)
    path = os.path.join(tmp_path, "blob.keras")
    bayes.save(path)
    loaded = keras.models.load_model(path)
    np.testing.assert_array_equal(loaded.posterior.rhos[0], bayes.posterior.rhos[0])
    np.testing.assert_array_equal(loaded.adapter_layers[0].lora_kernel_a, layer.lora_kernel_a)  # unmerged A, B
    np.testing.assert_array_equal(loaded.adapter_layers[0].lora_kernel_b, layer.lora_kernel_b)
    for _ in range(2):  # the seed state travels: the same draws
        np.testing.assert_array_equal(loaded(x), bayes(x))
    with tfbnn.posterior_mean(bayes), tfbnn.posterior_mean(loaded):
        np.testing.assert_array_equal(loaded(x), bayes(x))
    assert loaded.adapter_layers[0].lora_alpha == 4


def test_variational_lora_model_exports(tmp_path):
    """The SavedModel's ``sample_seeded`` equals the model reseeded as the export does, ``mean`` the posterior mean."""
    bayes, _ = _nested_bayes()
    x = _data(4)
    served = tf.saved_model.load(tfbnn.export.export(bayes, os.path.join(tmp_path, "sm"), num_samples=8,
                                                     task="regression",
                                                     input_signature=tf.TensorSpec((None, D), tf.float32)))
    generators = tfbnn.export.seed_generators(bayes)
    for i, generator in enumerate(generators):  # the export's reseeding: generator i at [seed, i 2^32]
        generator.state.assign(np.array([7, i * 2**32], generator.state.dtype))
    np.testing.assert_allclose(served.sample_seeded(tf.constant(x), tf.constant(7, tf.int64)), bayes(x),
                               rtol=1e-6, atol=1e-6)
    with tfbnn.posterior_mean(bayes):
        np.testing.assert_allclose(served.mean(tf.constant(x)), bayes(x), rtol=1e-6, atol=1e-6)
    assert np.all(served.summary(tf.constant(x))["epistemic_std"].numpy() > 0)


def test_variational_lora_model_rejects_bad_input():
    model, _ = _nested()
    with pytest.raises(ValueError, match="model='plain' without LoRA layers"):
        lora.variational(keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)], name="plain"))
    with pytest.raises(ValueError, match="model of type Dense"):
        lora.VariationalLoRAModel(keras.layers.Dense(2))
    with pytest.raises(ValueError, match="prior=.*ScaleMixture"):
        lora.VariationalLoRAModel(model, prior=tfbnn.priors.ScaleMixture(0.5, 1.0, 0.01))
    with pytest.raises(ValueError, match="seed='one'"):
        lora.VariationalLoRAModel(model, seed="one")
    with pytest.raises(ValueError, match="kl_weight=-1"):
        lora.VariationalLoRAModel(model, kl_weight=-1.0)
    with pytest.raises(ValueError, match="Received: num_samples=-2"):  # issue 36: a raw TensorFlow error before
        lora.VariationalLoRAModel(model).sample_a(-2)


def test_variational_lora_model_on_a_kerashub_classifier(tmp_path):
    """BLoB on a tiny BERT classifier after ``backbone.enable_lora(2)`` (query and value EinsumDense inside the
    attention layers): one ELBO step moves every ``A`` mean, ``rho`` and ``B``; ``tfbnn.predict`` gives distinct
    samples whose average is a distribution; the ``.keras`` file (whose backbone config has no LoRA) reloads the
    adapters and gives the same seeded predictions."""
    classifier = _tiny_lora_bert()
    layers = lora.lora_layers(classifier)
    for layer in layers:  # B = 0 after enable_lora: a nonzero adapter
        layer.lora_kernel_b.assign(np.full(layer.lora_kernel_b.shape, 0.3, "float32"))
    bayes = lora.variational(classifier, kl_weight=1e-3, rho_initializer=keras.initializers.Constant(-1.0), seed=0)
    assert len(layers) == 2 and len(bayes.posterior.rhos) == 2
    rng = np.random.default_rng(0)
    x = {"token_ids": rng.integers(0, 30, (6, 6)).astype("int32"), "segment_ids": np.zeros((6, 6), "int32"),
         "padding_mask": np.ones((6, 6), "int32")}
    y = rng.integers(0, 2, 6)
    moving = [v for layer in layers for v in (layer.lora_kernel_a, layer.lora_kernel_b)] + bayes.posterior.rhos
    before = [v.numpy().copy() for v in moving]
    bayes.compile(keras.optimizers.Adam(0.01), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    bayes.fit(x, y, batch_size=6, epochs=1, verbose=0)
    for variable, value in zip(moving, before):
        assert np.abs(variable.numpy() - value).max() > 1e-6, variable.path
    res = tfbnn.predict(bayes, x, num_samples=4, from_logits=True, return_samples=True)
    assert res.samples.shape == (4, 6, 2)
    assert len({tuple(np.round(s[0], 6)) for s in res.samples}) == 4  # T distinct draws
    np.testing.assert_allclose(res.mean_probs.sum(1), 1, rtol=1e-5)

    path = os.path.join(tmp_path, "bert_blob.keras")
    bayes.save(path)
    loaded = keras.models.load_model(path)
    assert [layer.lora_rank for layer in loaded.adapter_layers] == [2, 2]
    # enable_lora froze all but the adapters; a fresh backbone from the config would train everything
    assert [v.path for v in loaded.trainable_weights] == [v.path for v in bayes.trainable_weights]
    frozen = {v.path for v in bayes.weights} - {v.path for v in bayes.trainable_weights}
    assert {v.path for v in loaded.weights} - {v.path for v in loaded.trainable_weights} == frozen
    assert any("token_embedding" in path for path in frozen)
    np.testing.assert_array_equal(loaded.adapter_layers[0].lora_kernel_b, layers[0].lora_kernel_b)
    np.testing.assert_array_equal(loaded(x), bayes(x))


def test_variational_lora_keeps_lora_alpha_through_the_copy_and_a_reload(tmp_path):
    """Keras' build of a Dense configured with ``lora_rank`` resets ``lora_alpha`` to the rank: the wrapped copy and
    the reloaded layer keep the configured scale ``s = alpha / r = 2``, so the posterior mean is the LoRA model."""
    model = keras.Sequential([keras.Input((D,)), keras.layers.Dense(K)])
    model.layers[0].enable_lora(R, lora_alpha=2.0 * R)
    model.layers[0].lora_kernel_b.assign(np.ones((R, K), "float32"))
    x = _data(3)
    bayes = lora.variational(model, kl_weight=0.01, seed=0)
    path = os.path.join(tmp_path, "alpha.keras")
    bayes.save(path)
    loaded = keras.saving.load_model(path)
    for m in (bayes, loaded):
        assert m.layers[-1].layer.lora_alpha == 2.0 * R
        with tfbnn.posterior_mean(m):
            np.testing.assert_allclose(m(x), model(x), rtol=1e-6, atol=1e-6)


# -- mixed precision -----------------------------------------------------------------------------------
POLICIES = list(tfbnn.testing.MIXED_PRECISION_TOLERANCE)


@contextlib.contextmanager
def _policy(name):
    previous = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy(name)
    try:
        yield
    finally:
        keras.mixed_precision.set_global_policy(previous)


def _assert_float32_variables(model):
    assert [v.path for v in model.weights if "float" in str(v.dtype) and v.dtype != "float32"] == []


def _assert_close_to_float32(outputs, reference, policy):
    """The harness's mixed-precision tolerance (``tfbnn.testing``), relative to ``1 + max |float32 output|``."""
    tolerance = tfbnn.testing.MIXED_PRECISION_TOLERANCE[policy] * (1 + np.abs(reference).max())
    np.testing.assert_allclose(np.asarray(outputs, "float32"), reference, rtol=0, atol=tolerance)


def _variational_twins(policy, nested):
    """The same variational LoRA model (weights, sigma, seed state) in float32 and built under ``policy``."""
    build = _nested if nested else (lambda: _lora_dense(units=K))
    twins = []
    for name in ("float32", policy):
        with _policy(name):
            model, _ = build()
            bayes = lora.variational(model, kl_weight=0.01, seed=0)
        if twins:
            model.set_weights(twins[0][0].get_weights())
            bayes.set_weights(twins[0][1].get_weights())
        twins.append((model, bayes))
    (_, bayes32), (_, bayes) = twins
    posterior32, posterior = [b if nested else b.layers[-1] for b in (bayes32, bayes)]
    for p in (posterior32, posterior):
        for rho in (p.posterior.rhos if nested else [p.rho]):
            rho.assign(np.full(rho.shape, -1.0, "float32"))
        p = p.posterior if nested else p
        p.seed_generator.state.assign(np.array([5, 0], p.seed_generator.state.dtype))
    return bayes32, bayes, posterior32, posterior


@pytest.mark.parametrize("nested", [False, True], ids=["VariationalLoRA", "VariationalLoRAModel"])
@pytest.mark.parametrize("policy", POLICIES)
def test_variational_lora_under_a_mixed_policy(policy, nested):
    """Under ``mixed_float16`` / ``mixed_bfloat16`` (issue 36: fit failed on its first step, float16 against
    float32): the variables are float32; the KL is float32 and equals the float32 model's, also the loss a call adds;
    sampled outputs (the same seed state) and posterior-mean outputs are in the compute dtype and close to float32's;
    ``fit`` runs with a finite loss."""
    bayes32, bayes, posterior32, posterior = _variational_twins(policy, nested)
    x = _data(16)
    _assert_float32_variables(bayes)
    kl, expected = posterior.kl_divergence(), posterior32.kl_divergence()
    assert kl.dtype == "float32"
    np.testing.assert_allclose(kl, expected, rtol=1e-6)
    sampled, reference = bayes(x), bayes32(x).numpy()
    assert sampled.dtype == keras.mixed_precision.Policy(policy).compute_dtype
    [loss] = bayes.losses
    assert loss.dtype == "float32"
    np.testing.assert_allclose(loss, 0.01 * expected, rtol=1e-6)
    _assert_close_to_float32(sampled, reference, policy)
    with tfbnn.posterior_mean(bayes), tfbnn.posterior_mean(bayes32):
        mean, reference_mean = bayes(x), bayes32(x).numpy()
    assert mean.dtype == sampled.dtype
    _assert_close_to_float32(mean, reference_mean, policy)
    assert np.abs(reference - reference_mean).max() > 0.1  # the draw is checked, not only the mean

    bayes.compile(keras.optimizers.SGD(0.01), "mse")
    loss = bayes.fit(x, np.ones((16, K), "float32"), batch_size=8, epochs=1, verbose=0).history["loss"][-1]
    assert np.isfinite(loss)
    _assert_float32_variables(bayes)


@pytest.mark.parametrize("policy", POLICIES)
def test_to_model_under_a_mixed_policy(policy):
    """``LinearizedLoRA`` under a mixed policy (issue 36: the call failed, float16 against float32): Laplace-LoRA
    fits the model built under the policy; the sampler's posterior root is float32; a draw ``f + J delta`` (the JVP
    over the float32 factors, computed in the compute dtype) is in the compute dtype and close to the float32 model's
    ``f + J delta`` (``J`` by reverse mode, the same ``delta``), and so is the posterior mean; ``tfbnn.predict``
    runs."""
    x = _data(40)
    model32 = _lora_mlp()
    with _policy(policy):
        model = _lora_mlp()
        model.set_weights(model32.get_weights())
        la = lora.fit_laplace(model, x, (x[:, 0] > 0).astype("int32"), hessian="kron", prior_precision=0.5)
        sampler, twin = la.to_model(seed=3), la.to_model(seed=3)
    _assert_float32_variables(sampler)
    compute_dtype = keras.mixed_precision.Policy(policy).compute_dtype
    delta = _sampling_layer(twin).sample_offsets(1).numpy()[0].astype(np.float64)
    variables = [getattr(model32.layers[model.layers.index(layer)], f"lora_kernel_{w}") for layer, w in la.factors]
    f, jac = _lora_jacobian(model32, variables, x[:8])
    sampled = sampler(x[:8])
    assert sampled.dtype == compute_dtype
    _assert_close_to_float32(sampled, f + jac @ delta, policy)
    assert np.abs(jac @ delta).max() > 0.5  # J delta is far above the tolerance
    with tfbnn.posterior_mean(sampler):
        mean = sampler(x[:8])
    assert mean.dtype == compute_dtype
    _assert_close_to_float32(mean, f, policy)
    res = tfbnn.predict(sampler, x[:8], num_samples=16, from_logits=True)
    assert np.all(np.isfinite(res.mean_probs)) and np.all(res.mutual_information > 0)
    np.testing.assert_allclose(res.mean_probs.sum(-1), 1, rtol=1e-5)


# -- Keras' layer contract ------------------------------------------------------------------------------
def test_public_lora_layers_round_trip_their_config():
    """``cls.from_config(config).get_config() == config`` for every public Keras class of ``tfbnn.lora`` (issue 36:
    ``LinearizedLoRA``'s ``lora_alpha`` 2 with rank 1 came back as 1: Keras builds a deserialized Dense configured
    with ``lora_rank`` with alpha = rank), and ``from_config`` leaves the config it is given as it was; ``LinearizedLoRA.compute_output_shape`` keeps the
    batch size."""
    public = {cls for cls in (getattr(lora, name) for name in lora.__all__)
              if isinstance(cls, type) and issubclass(cls, keras.layers.Layer)}
    model = _lora_mlp()  # lora_alpha 2, rank 1
    features = keras.Model(model.inputs, model.layers[-1].input)
    linearized = lora.LinearizedLoRA(features, model.layers[-1], [[0, "a"], [1, "b"]], [[0, 1, 2.0], [1, 1, 2.0]])
    layers = [linearized, _variational()[1], _nested_bayes()[0]]
    assert {type(layer) for layer in layers} == public
    for layer in layers:
        config = layer.get_config()
        given = copy.deepcopy(config)
        assert type(layer).from_config(given).get_config() == config, type(layer).__name__
        assert given == config, type(layer).__name__
    assert layers[0].get_config()["last"]["config"]["lora_alpha"] == 2
    # Keras' contract: a known batch size is kept (it was None)
    assert linearized.compute_output_shape((4, D)) == (4, K)
    assert linearized.compute_output_shape({"token_ids": (5, 6), "padding_mask": (5, 6)}) == (5, K)
