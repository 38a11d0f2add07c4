import math

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_probability as tfp

from tfbnn import priors

tfd = tfp.distributions


def test_get_by_name_and_object():
    assert isinstance(priors.get("normal"), priors.Normal)
    assert isinstance(priors.get("scale_mixture"), priors.ScaleMixture)
    p = priors.ScaleMixture(0.25, 1.0, 3.35e-4)
    assert priors.get(p) is p


@pytest.mark.parametrize("prior", [priors.Normal(0.5, 0.2), priors.ScaleMixture(0.3, 2.0, 0.01)])
def test_serialize_round_trip(prior):
    restored = priors.deserialize(priors.serialize(prior))
    assert restored == prior and type(restored) is type(prior)


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
    ],
)
def test_bad_arguments(factory, match):
    with pytest.raises(ValueError, match=match):
        factory()
