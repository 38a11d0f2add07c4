"""DDU (tfbnn.ddu): the class densities against SciPy and scikit-learn's QDA on the same features."""

import copy

import keras
import numpy as np
import pytest
from scipy import special, stats
from sklearn.discriminant_analysis import QuadraticDiscriminantAnalysis

from tfbnn import ddu, inference
from tfbnn.layers import SpectralDense


def _model(d_in=5, classes=3):
    inputs = keras.Input((d_in,))
    h = SpectralDense(4, seed=0, name="features")(inputs)
    return keras.Model(inputs, keras.layers.Dense(classes, activation="softmax", name="head")(h))


def _data(n=60, d_in=5, classes=3, seed=0):
    rng = np.random.default_rng(seed)
    y = np.arange(n) % classes
    return (rng.normal(size=(n, d_in)) + y[:, None]).astype("float32"), y


@pytest.fixture(scope="module")
def fitted():
    model = _model()
    x, y = _data()
    return model, ddu.DDU(model, feature_layer="features").fit(x, y), x, y


def test_gda_matches_scipy_and_scikit_learn(fitted):
    model, gda, x, y = fitted
    z = keras.Model(model.input, model.get_layer("features").output).predict(x, verbose=0).astype(np.float64)
    assert gda.jitter_ == 0.0  # 20 examples per class in 4 dimensions: positive definite as it is
    test = _data(n=9, seed=1)[0]
    z_test = keras.Model(model.input, model.get_layer("features").output).predict(test, verbose=0).astype(np.float64)
    per_class = np.stack([np.log(np.mean(y == c)) + stats.multivariate_normal(
        z[y == c].mean(0), np.cov(z[y == c], rowvar=False)).logpdf(z_test) for c in range(3)], axis=1)
    np.testing.assert_allclose(gda.class_log_densities(test), per_class, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(gda.log_density(test), special.logsumexp(per_class, axis=1), rtol=1e-6, atol=1e-6)
    # scikit-learn's QDA: the same means and priors. DDU's reference code (and np.cov) divide the
    # covariance by N_c - 1; scikit-learn 1.9 divides by N_c (earlier releases by N_c - 1), so the
    # covariances are compared under the divisor of the installed release, read off class 0, and its
    # class posteriors are those of the rescaled covariances.
    qda = QuadraticDiscriminantAnalysis(store_covariance=True).fit(z, y)
    np.testing.assert_allclose(gda.means_, qda.means_, rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(gda.priors_, qda.priors_, rtol=1e-12)
    counts = np.bincount(y)[:, None, None]
    ddof = 0 if np.allclose(np.cov(z[y == 0], rowvar=False, ddof=0), qda.covariance_[0], rtol=1e-6) else 1
    np.testing.assert_allclose(gda.covariances_ * (counts - 1) / (counts - ddof), np.stack(qda.covariance_),
                               rtol=1e-6, atol=1e-9)
    rescaled = copy.copy(gda)
    rescaled._cholesky = np.linalg.cholesky(np.stack(qda.covariance_))
    posterior = rescaled.class_log_densities(test) - rescaled.log_density(test)[:, None]
    np.testing.assert_allclose(posterior, qda.predict_log_proba(z_test), rtol=1e-5, atol=1e-6)


def test_aleatoric_is_the_softmax_entropy_and_the_default_features_are_the_head_s_input(fitted):
    model, gda, x, y = fitted
    np.testing.assert_allclose(gda.aleatoric(x), inference.entropy(model.predict(x, verbose=0)), rtol=1e-6)
    default = ddu.DDU(model).fit(x, y)  # the output layer's input: the same features here
    np.testing.assert_allclose(default.means_, gda.means_, rtol=1e-6)
    by_model = ddu.DDU(model, feature_layer=keras.Model(model.input, model.get_layer("features").output)).fit(x, y)
    np.testing.assert_allclose(by_model.log_density(x[:5]), gda.log_density(x[:5]), rtol=1e-6)


def test_far_inputs_have_a_lower_density(fitted):
    _, gda, x, _ = fitted
    far = x[:10] + 6.0
    assert np.mean(gda.log_density(far)) < np.mean(gda.log_density(x[:10]))


def test_degenerate_features_get_a_jitter():
    inputs = keras.Input((2,))
    features = keras.layers.Dense(4, name="features")
    model = keras.Model(inputs, keras.layers.Dense(2, activation="softmax")(features(inputs)))
    # A constant feature (its kernel column and bias zero): each class covariance has an exact zero
    # row and column, so Cholesky fails without a jitter whatever the rounding (4 features of rank 2
    # alone were singular only up to rounding, and Cholesky sometimes passed).
    kernel, bias = features.get_weights()
    kernel[:, -1] = 0.0
    features.set_weights([kernel, np.zeros_like(bias)])
    x = np.random.default_rng(2).normal(size=(20, 2)).astype("float32")
    gda = ddu.DDU(model, feature_layer="features").fit(x, np.arange(20) % 2)
    assert gda.jitter_ > 0 and np.all(np.isfinite(gda.log_density(x)))
    assert np.all(np.linalg.eigvalsh(gda.covariances_) > 0)


def test_bad_input_is_named(fitted):
    model, gda, x, y = fitted
    with pytest.raises(ValueError, match=r"at least 2 examples of every class.*\[20, 20, 0\]"):
        ddu.DDU(model).fit(x[y < 2], y[y < 2])  # class 2 missing
    bad = x.copy()
    bad[0, 0] = np.nan
    with pytest.raises(ValueError, match="`x`"):
        gda.log_density(bad)
    with pytest.raises(ValueError, match="integer labels in \\[0, 3\\)"):
        ddu.DDU(model).fit(x, y + 1)
    with pytest.raises(ValueError, match="feature_layer='nope'"):
        ddu.DDU(model, feature_layer="nope")
    with pytest.raises(ValueError, match="Call fit"):
        ddu.DDU(model).log_density(x)
    with pytest.raises(ValueError, match="num_classes=1"):
        ddu.DDU(model, num_classes=1)
    for method in (gda.log_density, gda.class_log_densities, gda.features, gda.aleatoric):
        with pytest.raises(ValueError, match=r"Expected `x` with at least one example. Received: x of shape \(0, 5\)"):
            method(np.zeros((0, 5), "float32"))
