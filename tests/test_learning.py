"""A Bayes-by-Backprop MLP learns a real offline problem nearly as well as the same deterministic MLP."""

import keras
import numpy as np
import pytest

import tfbnn
from tfbnn import datasets


def _mlp(dense, **kwargs):
    return keras.Sequential(
        [keras.Input((64,)), dense(128, activation="relu", **kwargs.get("h", {})),
         dense(10, activation="softmax", **kwargs.get("o", {}))]
    )


@pytest.mark.heavy
def test_bbb_mlp_learns_digits_within_a_few_points_of_deterministic():
    ds = datasets.load("digits", seed=0)
    fit = dict(epochs=40, batch_size=64, verbose=0)

    keras.utils.set_random_seed(0)
    det = _mlp(keras.layers.Dense)
    det.compile(keras.optimizers.Adam(3e-3), "sparse_categorical_crossentropy", metrics=["accuracy"])
    det.fit(ds.x_train, ds.y_train, **fit)
    det_acc = det.evaluate(ds.x_test, ds.y_test, verbose=0)[1]

    keras.utils.set_random_seed(0)
    bbb = _mlp(tfbnn.DenseFlipout, h={"seed": 1, "kernel_prior": "scale_mixture"},
               o={"seed": 2, "kernel_prior": "scale_mixture"})
    bbb.compile(keras.optimizers.Adam(3e-3), "sparse_categorical_crossentropy")
    annealing = tfbnn.KLAnnealing(num_examples=ds.num_examples, schedule=tfbnn.schedules.Linear(epochs=10))
    history = bbb.fit(ds.x_train, ds.y_train, callbacks=[annealing], **fit)
    assert history.history["kl_beta"][-1] == 1.0  # trained on the full ELBO at the end
    probs = np.mean([bbb.predict(ds.x_test, verbose=0) for _ in range(20)], axis=0)
    bbb_acc = float(np.mean(probs.argmax(-1) == ds.y_test))

    print(f"deterministic {det_acc:.4f}  bbb {bbb_acc:.4f}")
    assert det_acc > 0.93, det_acc
    assert bbb_acc > det_acc - 0.03, (bbb_acc, det_acc)
    # The posterior did not collapse onto a point: samples still disagree somewhere.
    sampled = np.stack([bbb.predict(ds.x_test[:50], verbose=0) for _ in range(2)])
    assert np.abs(sampled[0] - sampled[1]).max() > 1e-3
