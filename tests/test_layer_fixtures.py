"""``.keras`` files saved by tfbnn 0.1 load with the current layers, with the same numbers.

The fixtures (``tests/fixtures/v0_1``, written by ``make_layer_fixtures.py``
before the layer refactor) hold one tiny model per layer class, the
posterior-mean output on a fixed input and the KL of the model as loaded.
"""

import json
import os

import numpy as np
import pytest

import keras
from tests.fixtures import make_layer_fixtures as fixtures

HERE = fixtures.HERE
with open(os.path.join(HERE, "configs.json")) as _f:
    SAVED = json.load(_f)["layers"]
OUTPUTS = np.load(os.path.join(HERE, "outputs.npz"))

# Config keys renamed since 0.1: old name -> current name (a value may change
# spelling only where listed in RENAMED_VALUES).
RENAMED_KEYS = {}
RENAMED_VALUES = {}


@pytest.mark.parametrize("name", sorted(SAVED))
def test_v0_1_file_loads_with_same_numbers(name):
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
    for key, value in saved["config"].items():
        new_key = RENAMED_KEYS.get(key, key)
        value = RENAMED_VALUES.get((key, json.dumps(value)), value)
        assert config[new_key] == value, (key, new_key)
