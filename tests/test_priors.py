import math

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_probability as tfp

import tfbnn
from tfbnn import priors

tfd = tfp.distributions


def test_get_by_name_and_object():
    assert isinstance(priors.get("normal"), priors.Normal)
    assert isinstance(priors.get("scale_mixture"), priors.ScaleMixture)
    p = priors.ScaleMixture(0.25, 1.0, 3.35e-4)
    assert priors.get(p) is p


_RNG = np.random.default_rng(0)  # restarted at every test (tests/conftest.py)
_POSTERIOR = priors.Posterior(_RNG.normal(size=(3, 4)), _RNG.uniform(1e-3, 2.0, size=(3, 4)))


@pytest.mark.parametrize("prior", [priors.Normal(0.5, 0.2), priors.ScaleMixture(0.3, 2.0, 0.01), _POSTERIOR])
def test_serialize_round_trip(prior):
    restored = priors.deserialize(priors.serialize(prior))
    assert restored == prior and type(restored) is type(prior)


def test_posterior_prior_round_trips_its_arrays_bit_for_bit_through_json():
    import json

    loc = np.array([[1e-30, -3.4e38], [0.1, np.float32(1) / 3]], "float32")
    scale = np.array([[1.18e-38, 4e18], [0.2, 1e-7]], "float32")
    config = json.loads(json.dumps(priors.serialize(priors.Posterior(loc, scale))))
    restored = priors.get(config)
    assert restored.loc.tobytes() == loc.tobytes() and restored.scale.tobytes() == scale.tobytes()
    assert restored.shape == (2, 2) and hash(restored) == hash(priors.Posterior(loc, scale))
    # A hand-written config may hold nested lists instead of base64.
    listed = priors.Posterior.from_config({"shape": [2, 2], "loc": loc.tolist(), "scale": scale.tolist()})
    assert listed == restored


def test_posterior_prior_density_is_the_per_weight_normal():
    x = _RNG.normal(size=(3, 4)).astype("float32")
    m, s = _POSTERIOR.loc.astype(float), _POSTERIOR.scale.astype(float)
    expected = -0.5 * ((x - m) / s) ** 2 - np.log(s) - 0.5 * np.log(2 * np.pi)
    np.testing.assert_allclose(_POSTERIOR.log_prob(tf.constant(x)).numpy(), expected, rtol=1e-5, atol=1e-5)
    assert _POSTERIOR.distribution().batch_shape == (3, 4)
    assert "shape=(3, 4)" in repr(_POSTERIOR)


def test_scale_mixture_is_eq7_mixture():
    pi, s1, s2 = 0.25, 1.0, math.exp(-6)
    x = np.linspace(-3, 3, 41).astype("float32")
    expected = np.log(
        pi * np.exp(-0.5 * (x / s1) ** 2) / (s1 * np.sqrt(2 * np.pi))
        + (1 - pi) * np.exp(-0.5 * (x / s2) ** 2) / (s2 * np.sqrt(2 * np.pi))
    )
    p = priors.ScaleMixture(pi, s1, s2)
    assert isinstance(p.distribution(), tfd.MixtureSameFamily)
    np.testing.assert_allclose(p.distribution().log_prob(x), expected, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(p.log_prob(tf.constant(x)), expected, rtol=1e-5, atol=1e-4)


def test_normal_prior_distribution():
    d = priors.Normal(0.5, 2.0).distribution()
    assert float(d.mean()) == 0.5 and float(d.stddev()) == 2.0


@pytest.mark.parametrize(
    "factory, match",
    [
        (lambda: priors.Normal(0.0, -1.0), "scale=-1.0"),
        (lambda: priors.Normal(0.0, 0.0), "scale=0.0"),
        (lambda: priors.ScaleMixture(1.5, 1.0, 0.1), "pi=1.5"),
        (lambda: priors.ScaleMixture(0.0, 1.0, 0.1), "pi=0.0"),
        (lambda: priors.ScaleMixture(0.5, -1.0, 0.1), "sigma1=-1.0"),
        (lambda: priors.ScaleMixture(0.5, 1.0, -0.1), "sigma2=-0.1"),
        (lambda: priors.get("laplace"), "prior='laplace'"),
        (lambda: priors.get(3), "prior=3"),
        (lambda: priors.Posterior(np.zeros((2, 3)), np.ones((3, 2))), r"`scale` to have the shape of `loc`, \(2, 3\)"),
        (lambda: priors.Posterior(np.zeros(3), [1.0, 0.0, 1.0]), r"Expected `scale`.*1 of 3 entries.*scale\[1\]=0.0"),
        (lambda: priors.Posterior(np.zeros(2), [1.0, -0.5]), r"scale\[1\]=-0.5"),
        (lambda: priors.Posterior(np.zeros(2), [np.nan, 1.0]), "Expected `scale`.*NaN or infinite"),
        (lambda: priors.Posterior(np.zeros(2), [1e-46, 1.0]), r"scale\[0\]=0.0"),  # 0 in float32
        (lambda: priors.Posterior([0.0, np.inf], np.ones(2)), "Expected `loc`.*NaN or infinite"),
        (lambda: priors.Posterior([0.0, 1e39], np.ones(2)), "Expected `loc`.*float32"),
        (lambda: priors.Posterior("abc", 1.0), "Expected `loc`.*numbers"),
        (lambda: priors.Posterior(np.zeros(2), [True, True]), "Expected `scale`.*not booleans"),
        (lambda: priors.Posterior.from_config({"shape": [2], "loc": "AAAA", "scale": "AAAA"}),
         "Expected `loc` to hold 2 float32 values"),
        (lambda: priors.Posterior.from_config({"shape": [1], "loc": "not base64!", "scale": "AAAA"}),
         "Expected `loc` to be base64"),
        (lambda: priors.get({"class_name": "Posterior", "config": {"loc": [1.0]}}), "Expected `config`.*shape"),
    ],
)
def test_bad_arguments(factory, match):
    with pytest.raises(ValueError, match=match):
        factory()


@pytest.mark.parametrize(
    "factory, match",
    [
        (lambda: priors.Normal(0.0, 1e-300), "Expected `scale`.*float32.*scale=1e-300"),  # was ZeroDivisionError
        (lambda: priors.Normal(0.0, 1e-46), "scale=1e-46"),  # 0 in float32: an infinite KL
        (lambda: priors.Normal(0.0, 1.34e154), "scale=1.34e"),  # was OverflowError
        (lambda: priors.Normal(0.0, 1e19), "scale=1e"),  # 0.5 / scale^2 is 0 in float32: a NaN KL
        (lambda: priors.Normal(1e300, 1.0), "Expected `loc`.*loc=1e"),
        (lambda: priors.ScaleMixture(0.5, 1.0, 1e-300), "sigma2=1e-300"),
        (lambda: priors.ScaleMixture(0.5, 1.34e154, 1.0), "sigma1=1.34e"),
        (lambda: priors.Graves(scale=1e-300), "scale=1e-300"),
        (lambda: priors.Graves(loc=-1e300), "loc=-1e"),
    ],
)
def test_scales_that_float32_cannot_hold_are_rejected(factory, match):
    with pytest.raises(ValueError, match=match):
        factory()


@pytest.mark.parametrize("scale", [float(np.finfo(np.float32).tiny), 1e-30, 2.0**62])
def test_scales_at_the_float32_limits_give_no_nan(scale):
    from tfbnn import kl

    loc, rho = tf.fill([3], 1e-3), tf.fill([3], -5.0)
    sigma = tf.nn.softplus(rho) + 1e-6
    for prior in (priors.Normal(0.0, scale), priors.Normal(-3e38, scale)):
        # A KL beyond float32 (tiny scales) is +inf, never NaN or a Python error.
        assert not np.isnan(kl.closed_form_kl(loc, sigma, prior).numpy())
        assert not np.isnan(kl.softplus_scale_and_normal_kl(loc, rho, prior)[1].numpy())
    mixture = priors.ScaleMixture(0.5, 1.0, scale)
    assert np.all(np.isfinite(mixture.log_prob(tf.constant([0.0, 1e-3, 1.0, 1e18])).numpy()))


def test_scale_mixture_log_density_is_stable_for_a_narrow_component():
    p = priors.ScaleMixture(0.5, 1.0, 1e-30)
    x = np.array([0.0, 1e-31, 1e-30, 1e-29, 1e-10, 1.0], "float32")
    got = p.log_prob(tf.constant(x)).numpy()
    assert np.all(np.isfinite(got))  # log_prob(0) was NaN (0 * inf)
    expected = p.distribution("float64").log_prob(x.astype("float64")).numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-5)
    # Beyond float32 (log p(1e30) ~ -5e59) the density is 0: -inf, not NaN.
    assert p.log_prob(tf.constant(1e30)).numpy() == -np.inf


# -- one prior vocabulary: every family takes a prior object ---------------------------------------------


def _families():
    return [
        (lambda p: tfbnn.layers.DenseFlipout(2, kernel_prior=p, bias_prior=p), "kernel_prior"),
        (lambda p: tfbnn.layers.NodeDense(2, node_prior=p), "node_prior"),
        (lambda p: tfbnn.layers.NodeNoise(node_prior=p), "node_prior"),
        (lambda p: tfbnn.layers.DenseRank1(2, fast_weight_prior=p), "fast_weight_prior"),
        (lambda p: tfbnn.layers.Conv2DRank1(2, 3, fast_weight_prior=p), "fast_weight_prior"),
    ]


@pytest.mark.parametrize("index", range(5))
def test_every_family_takes_one_prior_object_and_keeps_it_in_its_config(index):
    make, argument = _families()[index]
    prior = priors.Normal(1.0, 0.3)
    layer = make(prior)
    assert getattr(layer, argument) == prior
    assert layer.get_config()[argument] == priors.serialize(prior)
    restored = type(layer).from_config(layer.get_config())
    assert getattr(restored, argument) == prior


def test_dense_variational_takes_the_prior_object_as_make_prior_fn():
    layer = tfbnn.layers.DenseVariational(2, make_prior_fn=priors.Normal(1.0, 0.3), seed=0)
    layer.build((None, 3))
    n = 3 * 2 + 2
    p = layer.prior.distribution()
    np.testing.assert_array_equal(p.mean().numpy(), np.full(n, 1.0, "float32"))
    np.testing.assert_allclose(p.stddev().numpy(), np.full(n, 0.3), rtol=1e-6)


def test_the_zoo_passes_one_prior_object_to_each_family():
    prior = priors.Normal(0.0, 0.5)
    bbb = tfbnn.models.LayerFactory("bbb", {"prior": prior}, num_examples=10, seed=0)
    layer = bbb.dense(2)
    assert bbb.prior() == prior and layer.kernel_prior == layer.bias_prior == prior
    ibnn = tfbnn.models.LayerFactory("ibnn", {"prior_mean": 0.9, "prior_stddev": 0.2}, num_examples=10, seed=0)
    assert ibnn.prior() == ibnn.dense(2).node_prior == priors.Normal(0.9, 0.2)
    assert tfbnn.models.LayerFactory("vd", num_examples=10).prior() is None
