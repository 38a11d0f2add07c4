"""``.keras`` files saved by tfbnn 0.1 load with the current layers, with the same numbers.

The fixtures (``tests/fixtures/v0_1``, written by ``make_layer_fixtures.py``
before the layer refactor) hold one tiny model per layer class, the
posterior-mean output on a fixed input and the KL of the model as loaded.
"""

import json
import os
import warnings

import numpy as np
import pytest

import keras
from tfbnn import layers
from tests.fixtures import make_layer_fixtures as fixtures

HERE = fixtures.HERE
with open(os.path.join(HERE, "configs.json")) as _f:
    SAVED = json.load(_f)["layers"]
OUTPUTS = np.load(os.path.join(HERE, "outputs.npz"))

# Config keys renamed since 0.1: old name -> current name.
RENAMED_KEYS = {
    "kernel_loc_initializer": "kernel_initializer",
    "bias_loc_initializer": "bias_initializer",
    "kernel_rho_initializer": "kernel_scale_initializer",
    "bias_rho_initializer": "bias_scale_initializer",
    "posterior_parameterization": "scale_parameterization",
}
# Variational dropout's two scale initializers: the one its parameterization used
# is kernel_scale_initializer, the other had no effect and is gone.
VD_SCALE_KEYS = {"additive": "log_sigma2_initializer", "multiplicative": "log_alpha_initializer"}
# Arguments added since 0.1, with the value that reproduces 0.1.
ADDED_KEYS = {"data_format": "channels_last", "posterior": "mean_field", "posterior_rank": 2,
              "kernel_factor_initializer": None}


# 0.1's floats of the node layers' prior, now a field of their prior object (tfbnn 0.3).
FOLDED_KEYS = {"prior_mean": ("node_prior", "loc"), "prior_stddev": ("node_prior", "scale")}


def current_value(config, key, new_key):
    """The current config's value of the 0.1 key ``key``: under ``new_key``, or a field of it (an object)."""
    if key in FOLDED_KEYS:
        return config[new_key]["config"][FOLDED_KEYS[key][1]]
    return config[new_key]


def current_key(config, key):
    if key in VD_SCALE_KEYS.values():
        return "kernel_scale_initializer" if key == VD_SCALE_KEYS[config["parameterization"]] else None
    return FOLDED_KEYS.get(key, (RENAMED_KEYS.get(key, key),))[0]


@pytest.mark.parametrize("name", sorted(SAVED))
def test_v0_1_file_loads_with_same_numbers(name):
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)  # loading an old file is not deprecated
        model = keras.saving.load_model(os.path.join(HERE, name + ".keras"))
    y, kl = fixtures.evaluate(model, OUTPUTS[name + "/x"])
    np.testing.assert_allclose(y, OUTPUTS[name + "/y"], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(kl, float(OUTPUTS[name + "/kl"]), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("name", sorted(SAVED))
def test_v0_1_config_values_kept_under_current_names(name):
    model = keras.saving.load_model(os.path.join(HERE, name + ".keras"))
    (layer,) = fixtures.stochastic(model)
    saved = SAVED[name]
    assert type(layer).__name__ == saved["class_name"]
    config = fixtures.plain(layer.get_config())
    kept = set()
    for key, value in saved["config"].items():
        new_key = current_key(saved["config"], key)
        if new_key is not None:
            assert current_value(config, key, new_key) == value, (key, new_key)
            kept.add(new_key)
    for key in set(config) - kept:  # arguments added since 0.1 take the 0.1 behaviour
        assert config[key] == ADDED_KEYS[key], key


@pytest.mark.parametrize(
    "cls, old, new, value",
    [
        (layers.DenseFlipout, "kernel_loc_initializer", "kernel_initializer", "ones"),
        (layers.DenseReparameterization, "bias_rho_initializer", "bias_scale_initializer", -3.0),
        (layers.Conv2DFlipout, "posterior_parameterization", "scale_parameterization", "log_variance"),
        (layers.DenseFlipout, "parameterization", "scale_parameterization", "log_variance"),  # renamed in 0.3
        (layers.GravesDense, "kernel_rho_initializer", "kernel_scale_initializer", -4.0),
        (layers.DenseVariationalDropout, "log_sigma2_initializer", "kernel_scale_initializer", -7.0),
    ],
)
def test_old_argument_names_construct_with_a_deprecation_warning(cls, old, new, value):
    args = (3, 3) if cls is layers.Conv2DFlipout else (3,)
    init = keras.initializers.Constant(value) if isinstance(value, float) else value
    with pytest.warns(DeprecationWarning, match=f"`{old}` is renamed `{new}`"):
        layer = cls(*args, name="x", **{old: init})
    assert layer.get_config() == cls(*args, name="x", **{new: init}).get_config()
    with pytest.raises(ValueError, match=f"Expected `{new}` or its old name `{old}`, not both"):
        cls(*args, **{old: init, new: init})


def test_parameterization_is_variational_dropouts_and_the_scale_one_is_scale_parameterization():
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)  # variational dropout's name is not deprecated
        assert layers.DenseVariationalDropout(3, parameterization="multiplicative").parameterization == "multiplicative"
        flipout = layers.DenseFlipout(3, scale_parameterization="log_variance")
    assert flipout.parameterization == flipout.scale_parameterization == "log_variance"  # the old attribute, read-only
    assert "parameterization" not in flipout.get_config()
    with pytest.warns(DeprecationWarning, match="PARAMETERIZATIONS is deprecated: use .*SCALE_PARAMETERIZATIONS"):
        assert layers.mean_field.PARAMETERIZATIONS == layers.mean_field.SCALE_PARAMETERIZATIONS


def test_vd_multiplicative_takes_the_old_log_alpha_initializer():
    with pytest.warns(DeprecationWarning, match="`log_alpha_initializer` is renamed `kernel_scale_initializer`"):
        layer = layers.DenseVariationalDropout(
            3, parameterization="multiplicative", log_alpha_initializer=keras.initializers.Constant(-5.0),
            log_sigma2_initializer=keras.initializers.Constant(-1.0),  # unused by this form, dropped
        )
    layer.build((None, 2))
    np.testing.assert_array_equal(layer.kernel_log_alpha.numpy(), np.full((2, 3), -5.0, "float32"))
