"""Private Keras and TensorFlow API is reached through one module, tfbnn/_internal/keras_private.py (issue 36, 9)."""

import pathlib
import re

import keras
import numpy as np
import pytest

from tfbnn._internal import keras_private

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "tfbnn"
HOME = "_internal/keras_private.py"

# Every private Keras / TensorFlow name the package has used, and the unsupported overrides of Keras methods.
PRIVATE = {
    "keras.src": r"keras\.src\b",
    "tensorflow.python": r"tensorflow\.python\b",
    "Layer._flatten_layers": r"_flatten_layers\b",
    "KerasTensor._keras_history": r"_keras_history\b",
    "Layer._inbound_nodes": r"_inbound_nodes\b",
    "Layer._tracker": r"\._tracker\b",
    "tf.function._omit_frequent_tracing_warning": r"_omit_frequent_tracing_warning\b",
    "Model._compile_metrics": r"_compile_metrics\b",
    "Model._symbolic_build": r"_symbolic_build\b",
    "Model._initial_epoch": r"_initial_epoch\b",
    "Dense._kernel": r"[\"']_kernel[\"']|\._kernel\b",
    "sys._getframe": r"_getframe\b",
    "an instance's call replaced": r"\.call\s*=[^=]|del\s+[\w.]+\.call\b",
    "an instance's saving replaced": r"\.(save|load)_own_variables\s*=[^=]|del\s+[\w.]+\.(save|load)_own_variables\b",
    "the call context": r"current_call_ctx\b|global_state\b",
}


def _uses():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE).as_posix()
        if relative == HOME:
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            for name, pattern in PRIVATE.items():
                if re.search(pattern, line):
                    found.append(f"tfbnn/{relative}:{number}: {name}: {line.strip()}")
    return found


def test_no_module_but_keras_private_touches_private_keras_or_tensorflow_api():
    assert _uses() == []
    home = (PACKAGE / HOME).read_text()
    assert all(re.search(pattern, home) for name, pattern in PRIVATE.items() if name != "sys._getframe"
               and name != "Model._compile_metrics" and name != "Layer._tracker")


def test_every_function_says_which_private_api_and_its_public_replacement():
    for name in keras_private.__all__:
        value = getattr(keras_private, name)
        if callable(value) and not name.startswith("restore_"):
            assert "Public" in value.__doc__ and ("Private" in value.__doc__ or "public" in value.__doc__.lower()), name


def test_the_helpers_agree_with_keras():
    inner = keras.Sequential([keras.Input((3,), name="inner_x"), keras.layers.Dense(3, name="inner_dense")], name="inner")
    x = keras.Input((3,), name="x")
    hidden = keras.layers.Dense(3, name="hidden")(x)
    added = keras.layers.Add(name="add")([inner(hidden), hidden])
    model = keras.Model(x, keras.layers.Dense(1, name="out")(added))
    assert [l.name for l in keras_private.sublayers(model)] == [
        "x", "hidden", "inner", "inner_dense", "inner_x", "add", "out"]  # Keras' order, nested layers in place
    assert [l.name for l in keras_private.sublayers(model, recursive=False)] == [l.name for l in model.layers]
    assert keras_private.sublayers(model, include_self=True)[0] is model
    assert keras_private.output_layer(model).name == "out"
    assert keras_private.output_layer(inner).name == "inner_dense"
    assert keras_private.inbound_layer(model.get_layer("out")) is model.get_layer("add")
    dense = model.get_layer("hidden")
    keras_private.override_call(dense, lambda inputs, *a, **k: inputs[:, :1] * 0 + 7)
    np.testing.assert_array_equal(dense(np.ones((2, 3), "float32")), 7)
    keras_private.restore_call(dense)
    assert dense(np.ones((2, 3), "float32")).shape == (2, 3)
    assert keras_private.in_xla_context() is False
    assert hasattr(keras_private.keras_test_case(), "run_layer_test")


@pytest.mark.parametrize("lora", [False, True])
def test_the_lora_base_kernel_is_the_unmerged_kernel(lora):
    layer = keras.layers.Dense(2)
    layer.build((None, 3))
    if lora:
        layer.enable_lora(1)
        layer.lora_kernel_b.assign(np.ones((1, 2), "float32"))
    base = getattr(layer, keras_private.LORA_BASE_KERNEL)
    assert np.allclose(base.numpy() + (layer.lora_kernel_a.numpy() @ layer.lora_kernel_b.numpy() * layer.lora_alpha
                                       / layer.lora_rank if lora else 0), layer.kernel.numpy())
