"""Pruning: masks against their definitions, applying them, random baselines, reports,
the SparsityMonitor, sparse export sizes, and principled vs random pruning on digits."""

import json
import os

import keras
import numpy as np
import pytest

import tfbnn
from tfbnn import callbacks, convert, pruning, schedules

VD = tfbnn.layers.DenseVariationalDropout


def _vd_model(log_alpha, theta, seed=1):
    """A one-layer VD model with the given theta and log alpha (additive form)."""
    layer = VD(theta.shape[1], seed=seed, name="vd")
    model = keras.Sequential([keras.Input((theta.shape[0],)), layer])
    layer.kernel_loc.assign(theta)
    layer.kernel_log_sigma2.assign(log_alpha + np.log(theta.astype(np.float64) ** 2 + 1e-8).astype("float32"))
    return model, layer


def _two_layer_model():
    rng = np.random.default_rng(0)
    model = keras.Sequential([
        keras.Input((6,)),
        VD(5, activation="relu", seed=1, name="vd"),
        tfbnn.layers.GravesDense(3, seed=2, name="graves"),
    ])
    vd, graves = model.layers
    theta = rng.normal(size=(6, 5)).astype("float32")
    vd.kernel_loc.assign(theta)
    vd.kernel_log_sigma2.assign((rng.uniform(-6, 6, size=(6, 5)) + np.log(theta**2)).astype("float32"))
    graves.kernel_rho.assign(rng.uniform(-4, 0, size=(5, 3)).astype("float32"))
    return model


# -- masks --------------------------------------------------------------------------------
def test_log_alpha_mask_is_molchanovs_rule():
    rng = np.random.default_rng(0)
    log_alpha = rng.uniform(-5, 7, size=(8, 4)).astype("float32")
    theta = rng.normal(size=(8, 4)).astype("float32")
    _, layer = _vd_model(log_alpha, theta)
    computed = layer.log_alpha().numpy()
    np.testing.assert_array_equal(pruning.log_alpha_mask(layer), computed <= 3.0)
    np.testing.assert_array_equal(pruning.log_alpha_mask(layer, threshold=0.0), computed <= 0.0)
    assert 0 < pruning.sparsity(pruning.log_alpha_mask(layer)) < 1


def test_snr_mask_is_graves_rule():
    model = _two_layer_model()
    vd, graves = model.layers
    mu, sigma = graves.kernel_loc.numpy(), graves.kernel_scale().numpy()
    np.testing.assert_array_equal(pruning.snr_mask(graves), np.abs(mu) / sigma >= 0.83)
    np.testing.assert_array_equal(pruning.snr_mask(graves, 2.0), np.abs(mu) / sigma >= 2.0)
    # For variational dropout |theta| / sigma = alpha^(-1/2).
    np.testing.assert_allclose(pruning.signal_to_noise(vd), np.exp(-0.5 * vd.log_alpha().numpy()), rtol=1e-4)


def test_compute_masks_picks_the_criterion_per_layer():
    model = _two_layer_model()
    masks = pruning.compute_masks(model)
    assert set(masks) == {"vd", "graves"}
    np.testing.assert_array_equal(masks["vd"], pruning.log_alpha_mask(model.layers[0]))
    np.testing.assert_array_equal(masks["graves"], pruning.snr_mask(model.layers[1]))
    snr = pruning.compute_masks(model, criterion="snr", threshold=1.0)
    np.testing.assert_array_equal(snr["vd"], pruning.snr_mask(model.layers[0], 1.0))
    report = pruning.sparsity_report(model, masks)
    assert [r.criterion for r in report.layers] == ["log_alpha", "snr"]
    assert report.num_weights == 30 + 15
    assert report.num_pruned == sum(int((~m).sum()) for m in masks.values())
    text = str(report)
    assert "vd" in text and "graves" in text and "total" in text and f"{100 * report.sparsity:.2f}%" in text
    assert report.as_dict()["layers"][0]["num_weights"] == 30


def test_random_masks_match_sparsity_per_layer():
    model = _two_layer_model()
    masks = pruning.compute_masks(model)
    rand = pruning.random_masks(masks, seed=3)
    for name in masks:
        assert rand[name].shape == masks[name].shape
        assert rand[name].sum() == masks[name].sum()
    assert any(not np.array_equal(rand[n], masks[n]) for n in masks)
    again = pruning.random_masks(masks, seed=3)
    assert all(np.array_equal(again[n], rand[n]) for n in masks)


# -- fixed fractions ------------------------------------------------------------------------
def _expected_pruned(model, fraction, scope, criterion="auto"):
    """Independently: {layer: set of pruned flat indices}, lowest score first, ties by (layer, index)."""
    entries = []
    for li, layer in enumerate(model.layers):
        if criterion == "snr" or not isinstance(layer, VD):
            mu, sigma = layer.kernel_loc.numpy().ravel(), layer.kernel_scale().numpy().ravel()
            score = [np.log(abs(float(m)) / float(s)) if m != 0 else -np.inf for m, s in zip(mu, sigma)]
        else:  # the larger log alpha, the lower alpha^(-1/2)
            score = [-0.5 * float(a) for a in layer.log_alpha().numpy().ravel()]
        entries.append([(sc, li, i) for i, sc in enumerate(score)])
    groups = [sum(entries, [])] if scope == "global" else entries
    pruned = {layer.name: set() for layer in model.layers}
    for group in groups:
        for _, li, i in sorted(group)[:round(fraction * len(group))]:
            pruned[model.layers[li].name].add(i)
    return pruned


@pytest.mark.parametrize("scope", ["global", "layer"])
@pytest.mark.parametrize("criterion", ["auto", "snr"])
def test_fraction_masks_prune_exactly_the_lowest_signal_to_noise_weights(scope, criterion):
    model = _two_layer_model()
    for fraction in (0.0, 0.1, 0.5, 0.75, 0.95, 0.98):
        masks = pruning.fraction_masks(model, fraction, criterion=criterion, scope=scope)
        expected = _expected_pruned(model, fraction, scope, criterion)
        assert set(masks) == {"vd", "graves"}
        for name, mask in masks.items():
            assert mask.dtype == bool and mask.shape == model.get_layer(name).kernel_loc.shape
            assert set(np.flatnonzero(~mask.ravel())) == expected[name], (fraction, name)
        if scope == "global":
            assert sum(int((~m).sum()) for m in masks.values()) == round(fraction * 45)
        else:
            assert [int((~masks[n]).sum()) for n in ("vd", "graves")] == [round(fraction * 30), round(fraction * 15)]
    assert all(m.all() for m in pruning.fraction_masks(model, 0.0, scope=scope).values())


def test_fraction_masks_break_ties_by_position_and_prune_zeroed_weights_first():
    rng = np.random.default_rng(0)
    theta = rng.normal(size=(4, 5)).astype("float32")
    model, layer = _vd_model(np.full((4, 5), 20.0, "float32"), theta)  # every log alpha clips to the same max
    assert np.all(layer.log_alpha().numpy() == layer.log_alpha().numpy()[0, 0])
    mask = pruning.fraction_masks(model, 0.3)["vd"]
    np.testing.assert_array_equal(np.flatnonzero(~mask.ravel()), np.arange(6))  # first 6 in C order
    graves_model = keras.Sequential([keras.Input((3,)), tfbnn.layers.GravesDense(4, seed=1, name="a"),
                                     tfbnn.layers.GravesDense(2, seed=2, name="b")])
    for g in graves_model.layers:
        g.kernel_loc.assign(np.full(g.kernel_loc.shape, 0.5, "float32"))
        g.kernel_rho.assign(np.full(g.kernel_rho.shape, -1.0, "float32"))
    masks = pruning.fraction_masks(graves_model, 0.5)  # 10 of 20 tied weights: all of "a" (12) comes first
    assert int((~masks["a"]).sum()) == 10 and masks["b"].all()
    np.testing.assert_array_equal(np.flatnonzero(~masks["a"].ravel()), np.arange(10))
    # Already-zero weights rank lowest, whatever their scale.
    theta[2, 3] = theta[0, 4] = 0.0
    model, _ = _vd_model(np.full((4, 5), -5.0, "float32"), theta)
    np.testing.assert_array_equal(np.flatnonzero(~pruning.fraction_masks(model, 0.1)["vd"].ravel()), [4, 13])
    again = pruning.fraction_masks(graves_model, 0.5)
    assert all(np.array_equal(again[n], masks[n]) for n in masks)


def test_fraction_arguments_are_checked():
    model = _two_layer_model()
    x, y = np.zeros((4, 6), "float32"), np.zeros(4, int)
    for bad, shown in ((1.0, "fraction=1.0"), (-0.1, "fraction=-0.1"), (float("nan"), "fraction=nan"),
                       ("half", "fraction='half'"), (True, "fraction=True")):
        with pytest.raises(ValueError, match=f"Expected `fraction` to be a number in \\[0, 1\\). Received: {shown}"):
            pruning.fraction_masks(model, bad)
    with pytest.raises(ValueError, match="Expected `scope` in \\('global', 'layer'\\). Received: scope='model'"):
        pruning.fraction_masks(model, 0.5, scope="model")
    with pytest.raises(ValueError, match="criterion='magnitude'"):
        pruning.fraction_masks(model, 0.5, criterion="magnitude")
    with pytest.raises(ValueError, match="log-alpha criterion needs a variational-dropout layer.*GravesDense"):
        pruning.fraction_masks(model, 0.5, criterion="log_alpha")
    with pytest.raises(ValueError, match="at least one built Bayesian layer"):
        pruning.fraction_masks(keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)]), 0.5)
    with pytest.raises(ValueError, match="Received: fractions=0.5"):
        pruning.pruning_curve(model, x, y, fractions=0.5)
    with pytest.raises(ValueError, match="Received: fraction=1.5"):
        pruning.pruning_curve(model, x, y, fractions=(0.5, 1.5))
    with pytest.raises(ValueError, match="Received: fractions=\\[\\]"):
        pruning.pruning_curve(model, x, y, fractions=())
    with pytest.raises(ValueError, match="num_samples=0"):
        pruning.pruning_curve(model, x, y, num_samples=0)
    with pytest.raises(ValueError, match="y of shape \\(3,\\)"):
        pruning.pruning_curve(model, x, y[:3])


# -- applying masks -----------------------------------------------------------------------
def test_pruned_predictions_exclude_pruned_weights_when_sampling_and_in_mean_mode():
    rng = np.random.default_rng(1)
    theta = rng.normal(size=(6, 4)).astype("float32")
    log_alpha = np.where(rng.uniform(size=(6, 4)) < 0.5, 6.0, -30.0).astype("float32")  # pruned ones: huge noise
    model, layer = _vd_model(log_alpha, theta)
    layer.min_log_alpha = -30.0  # kept weights: essentially noiseless
    x = rng.normal(size=(10, 6)).astype("float32")
    masks = pruning.compute_masks(model)
    np.testing.assert_array_equal(masks["vd"], log_alpha <= 3)
    expected = x @ (theta * masks["vd"]) + layer.bias_loc.numpy()
    before = model(x).numpy()
    assert np.abs(before - expected).max() > 0.5  # the noisy weights matter unpruned
    with pruning.pruned(model, masks):
        np.testing.assert_allclose(model(x).numpy(), expected, rtol=1e-4, atol=1e-4)  # sampled
        with tfbnn.posterior_mean(model):
            np.testing.assert_allclose(model(x).numpy(), expected, rtol=1e-5, atol=1e-6)
        # Already-zero weights count as pruned: masks are stable after pruning.
        np.testing.assert_array_equal(pruning.compute_masks(model)["vd"], masks["vd"])
    np.testing.assert_array_equal(layer.kernel_loc.numpy(), theta)  # restored exactly


def test_apply_masks_in_place_and_as_a_copy_on_gaussian_layers():
    model = _two_layer_model()
    x = np.random.default_rng(2).normal(size=(7, 6)).astype("float32")
    masks = pruning.compute_masks(model)
    theta_before = [l.kernel_loc.numpy().copy() for l in model.layers]
    pruned = pruning.apply_masks(model, masks, copy=True)
    assert pruned is not model
    for layer, before in zip(model.layers, theta_before):
        np.testing.assert_array_equal(layer.kernel_loc.numpy(), before)
    graves = pruned.layers[1]
    assert np.all(graves.kernel_loc.numpy()[~masks["graves"]] == 0)
    assert np.all(graves.kernel_scale().numpy()[~masks["graves"]] < 1e-15)
    with tfbnn.posterior_mean(pruned):
        mean_pruned = pruned(x).numpy()
    h = np.maximum(x @ (theta_before[0] * masks["vd"]) + model.layers[0].bias_loc.numpy(), 0)
    np.testing.assert_allclose(mean_pruned, h @ (theta_before[1] * masks["graves"]) + model.layers[1].bias_loc.numpy(),
                               rtol=1e-4, atol=1e-5)
    assert pruning.apply_masks(model, masks) is model
    assert pruning.sparsity_report(model).sparsity == pytest.approx(pruning.sparsity(masks))


def test_bad_input_is_rejected_clearly():
    model = _two_layer_model()
    with pytest.raises(ValueError, match="threshold=-0.83"):
        pruning.snr_mask(model.layers[1], threshold=-0.83)
    with pytest.raises(ValueError, match="threshold=0.0"):
        pruning.compute_masks(model, criterion="snr", threshold=0.0)
    with pytest.raises(ValueError, match="threshold=nan"):
        pruning.log_alpha_mask(model.layers[0], threshold=float("nan"))
    with pytest.raises(ValueError, match="criterion='magnitude'"):
        pruning.compute_masks(model, criterion="magnitude")
    with pytest.raises(ValueError, match="log-alpha criterion needs a variational-dropout layer.*GravesDense"):
        pruning.compute_masks(model, criterion="log_alpha")
    with pytest.raises(ValueError, match="not prunable layers of the model: \\['nope'\\]"):
        pruning.apply_masks(model, {"nope": np.ones((2, 2), bool)})
    with pytest.raises(ValueError, match="kernel's shape"):
        pruning.apply_masks(model, {"vd": np.ones((2, 2), bool)})
    det = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    with pytest.raises(ValueError, match="at least one built Bayesian layer"):
        pruning.compute_masks(det)


# -- the callback ---------------------------------------------------------------------------
def test_sparsity_monitor_logs_per_layer_sparsity_each_epoch():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 6)).astype("float32")
    y = rng.integers(0, 3, size=64)
    model = keras.Sequential([
        keras.Input((6,)),
        VD(8, activation="relu", seed=1, name="h", kernel_scale_initializer=keras.initializers.Constant(-2.0)),
        VD(3, activation="softmax", seed=2, name="out"),
    ])
    model.compile(keras.optimizers.Adam(0.05), "sparse_categorical_crossentropy")
    monitor = callbacks.SparsityMonitor()
    history = model.fit(x, y, epochs=3, batch_size=32, verbose=0,
                        callbacks=[tfbnn.KLAnnealing(64, "constant"), monitor])
    for key in ("sparsity", "sparsity/h", "sparsity/out"):
        assert len(history.history[key]) == 3
    assert len(monitor.reports) == 3
    assert history.history["sparsity/h"][-1] == pytest.approx(monitor.reports[-1].per_layer()["h"])
    assert history.history["sparsity"][-1] == pytest.approx(pruning.sparsity_report(model).sparsity)
    with pytest.raises(ValueError, match="threshold=-1"):
        callbacks.SparsityMonitor(criterion="snr", threshold=-1)


# -- stored size --------------------------------------------------------------------------------
def test_sparse_export_shrinks_with_sparsity_and_round_trips(tmp_path):
    rng = np.random.default_rng(0)
    theta = rng.normal(size=(300, 100)).astype("float32")
    x = rng.normal(size=(5, 300)).astype("float32")
    sizes = {}
    for s in (0.0, 0.5, 0.9, 0.99):
        log_alpha = np.where(rng.uniform(size=theta.shape) < s, 6.0, -4.0).astype("float32")
        model, layer = _vd_model(log_alpha, theta)
        masks = pruning.compute_masks(model)
        path = str(tmp_path / f"m{s}.npz")
        sizes[s] = pruning.export_sparse(model, path, masks)
        assert sizes[s] == os.path.getsize(path)
        restored, _ = _vd_model(np.zeros_like(log_alpha), rng.normal(size=theta.shape).astype("float32"), seed=9)
        pruning.restore_sparse(restored, path)
        with pruning.pruned(model, masks), tfbnn.posterior_mean(model), tfbnn.posterior_mean(restored):
            np.testing.assert_allclose(restored(x).numpy(), model(x).numpy(), rtol=1e-6)
        if s == 0.9:
            with_scales = pruning.export_sparse(model, str(tmp_path / "scales.npz"), masks, include_scales=True)
            assert sizes[s] < with_scales < 2.2 * sizes[s]
    assert sizes[0.0] > sizes[0.5] > sizes[0.9] > sizes[0.99]
    assert sizes[0.9] < 0.2 * sizes[0.0] and sizes[0.99] < 0.03 * sizes[0.0]


def test_compressed_keras_file_loads_and_is_smaller_when_pruned(tmp_path):
    rng = np.random.default_rng(0)
    theta = rng.normal(size=(200, 50)).astype("float32")
    log_alpha = np.where(rng.uniform(size=theta.shape) < 0.9, 6.0, -4.0).astype("float32")
    model, _ = _vd_model(log_alpha, theta)
    plain = str(tmp_path / "plain.keras")
    model.save(plain)
    dense_size = pruning.save_compressed(model, str(tmp_path / "dense.keras"))
    pruning.apply_masks(model, pruning.compute_masks(model))
    size = pruning.save_compressed(model, str(tmp_path / "pruned.keras"))
    assert size < 0.5 * dense_size and size < 0.5 * os.path.getsize(plain)
    loaded = keras.saving.load_model(str(tmp_path / "pruned.keras"))
    x = rng.normal(size=(3, 200)).astype("float32")
    with tfbnn.posterior_mean(model), tfbnn.posterior_mean(loaded):
        np.testing.assert_allclose(loaded(x).numpy(), model(x).numpy(), rtol=1e-6)
    with pytest.raises(ValueError, match="'.keras'"):
        pruning.save_compressed(model, str(tmp_path / "m.h5"))


# -- principled vs random pruning on a learnable offline problem ----------------------------------------
@pytest.fixture(scope="module")
def trained_vd_digits():
    keras.utils.set_random_seed(0)
    ds = tfbnn.datasets.load("digits", seed=0)
    det = keras.Sequential([
        keras.Input((64,)),
        keras.layers.Dense(100, activation="relu", name="fc1"),
        keras.layers.Dense(10, activation="softmax", name="fc2"),
    ])
    det.compile(keras.optimizers.Adam(3e-3), "sparse_categorical_crossentropy")
    det.fit(ds.x_train, ds.y_train, epochs=5, batch_size=128, verbose=0)
    model = convert.to_bayesian(det, method="vd", init_scale="moped", moped_delta=0.1, seed=1)
    model.compile(keras.optimizers.Adam(3e-3), "sparse_categorical_crossentropy")
    model.fit(ds.x_train, ds.y_train, epochs=15, batch_size=128, verbose=0,
              callbacks=[tfbnn.KLAnnealing(ds.num_examples, schedules.WarmUp(1, 7.5))])
    return model, ds


def _mc_accuracy(model, ds, masks=None, num_samples=10):
    def run():
        probs = tfbnn.predict(model, ds.x_test, num_samples=num_samples, batch_size=360).mean_probs
        return float(np.mean(probs.argmax(-1) == ds.y_test))

    if masks is None:
        return run()
    with pruning.pruned(model, masks):
        return run()


@pytest.mark.heavy
def test_principled_pruning_keeps_accuracy_and_random_pruning_does_not(trained_vd_digits):
    model, ds = trained_vd_digits
    masks = pruning.compute_masks(model)
    report = pruning.sparsity_report(model, masks)
    assert report.sparsity > 0.6, str(report)
    full = _mc_accuracy(model, ds)
    principled = _mc_accuracy(model, ds, masks)
    random = np.mean([_mc_accuracy(model, ds, pruning.random_masks(masks, seed=s)) for s in range(3)])
    print(f"\n{report}\nMC accuracy: none {full:.4f}, principled {principled:.4f}, random {random:.4f}")
    assert full > 0.9
    assert principled >= full - 0.01
    assert random < full - 0.2


@pytest.mark.heavy
def test_pruning_curve_principled_beats_random_and_is_written(trained_vd_digits, tmp_path):
    model, ds = trained_vd_digits
    before = [v.numpy().copy() for v in model.weights]
    rows = pruning.pruning_curve(model, ds.x_test, ds.y_test, fractions=(0.0, 0.5, 0.95), num_samples=5, seed=0)
    assert all(np.array_equal(v.numpy(), b) for v, b in zip(model.weights, before))  # restored
    assert [r["fraction"] for r in rows] == [0.0, 0.5, 0.95]
    total = sum(layer.kernel_loc.shape.num_elements() for layer in pruning.prunable_layers(model))
    assert [r["num_pruned"] for r in rows] == [0, round(0.5 * total), round(0.95 * total)]
    assert rows[1]["sparsity"] == pytest.approx(0.5, abs=1e-3)
    full, half, most = rows
    print("\n" + pruning.format_pruning_curve(rows))
    assert full["accuracy"] > 0.9
    # The model prunes > 60% by log alpha > 3 (test above): half of the weights carry no signal.
    assert half["accuracy"] >= full["accuracy"] - 0.02
    assert half["accuracy"] >= half["random_accuracy"] + 0.05
    assert most["accuracy"] >= most["random_accuracy"]
    paths = pruning.write_pruning_curve(rows, str(tmp_path / "out"))
    assert [os.path.basename(p) for p in paths] == ["pruning_curve.csv", "pruning_curve.json", "pruning_curve.png"]
    assert all(os.path.getsize(p) > 0 for p in paths)
    stored = json.load(open(paths[1]))["rows"]
    assert [r["accuracy"] for r in stored] == [r["accuracy"] for r in rows]
    with open(paths[0]) as f:
        assert f.readline().strip() == "fraction,num_pruned,sparsity,accuracy,random_accuracy"
    no_random = pruning.pruning_curve(model, ds.x_test[:50], ds.y_test[:50], fractions=(0.5,), num_samples=2,
                                      scope="layer", random_baseline=False)
    assert no_random[0]["random_accuracy"] is None
    assert "-" in pruning.format_pruning_curve(no_random)
