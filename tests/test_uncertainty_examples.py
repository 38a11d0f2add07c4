"""The docstring examples of the uncertainty modules run and print what they show."""

import doctest
import importlib

import keras
import numpy as np
import tensorflow as tf

import tfbnn

MODULES = ["tfbnn.inference", "tfbnn.likelihoods", "tfbnn.metrics", "tfbnn.calibration", "tfbnn.datasets.corruptions"]


def test_docstring_examples():
    failed = {}
    for name in MODULES:
        result = doctest.testmod(
            importlib.import_module(name),
            extraglobs={"np": np, "keras": keras, "tf": tf, "tfbnn": tfbnn},
            optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE,
            verbose=False,
        )
        assert result.attempted > 0, name
        if result.failed:
            failed[name] = result.failed
    assert not failed, f"docstring examples failed (details above): {failed}"
