import os

import keras
import numpy as np
import pytest

import tfbnn
from tfbnn import ensembles


def _x(n=12, d=5, seed=0):
    return np.random.default_rng(seed).normal(size=(n, d)).astype("float32")


def _dense_member(seed, d=5, classes=3):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((d,)), keras.layers.Dense(8, activation="relu"),
                             keras.layers.Dense(classes, activation="softmax")])


def _bayesian_member(seed, d=5, classes=3):
    return tfbnn.models.mlp("bbb", hidden_units=(8,), num_classes=classes, input_shape=(d,),
                              num_examples=100, seed=seed, name=f"bbb_{seed}")


def _entropy(p):
    return -np.sum(np.where(p > 0, p * np.log(np.where(p > 0, p, 1.0)), 0.0), axis=-1)


def test_deterministic_ensemble_predictive_is_the_numpy_mean_of_its_members_and_the_split_matches():
    x = _x()
    members = [_dense_member(s) for s in ensembles.member_seeds(0, 4)]
    ensemble = tfbnn.DeepEnsemble(members)
    each = np.stack([m.predict(x, verbose=0) for m in members]).astype(np.float64)  # (M, B, C)
    res = tfbnn.predict(ensemble, x, num_samples=25, return_samples=True, batch_size=5)
    # Deterministic members: one sample each is exact, whatever num_samples says.
    assert res.num_samples == 4 and res.samples.shape == (4, 12, 3)
    np.testing.assert_array_equal(res.samples_used, np.full(12, 4))
    np.testing.assert_allclose(res.samples, each, atol=1e-6)
    p_bar = each.mean(axis=0)
    np.testing.assert_allclose(res.mean_probs, p_bar, atol=1e-6)
    np.testing.assert_allclose(ensemble.predict(x, verbose=0), p_bar, atol=1e-6)  # call = the mixture
    total, aleatoric = _entropy(p_bar), _entropy(each).mean(axis=0)
    np.testing.assert_allclose(res.predictive_entropy, total, rtol=1e-5)
    np.testing.assert_allclose(res.expected_entropy, aleatoric, rtol=1e-5)
    np.testing.assert_allclose(res.mutual_information, total - aleatoric, atol=1e-6)
    assert np.all(res.mutual_information > 1e-4)  # the members disagree


def test_bayesian_members_give_m_times_t_member_major_samples():
    x = _x(7)
    members = [_bayesian_member(s) for s in ensembles.member_seeds(0, 3)]
    ensemble = tfbnn.DeepEnsemble(members)
    res = tfbnn.predict(ensemble, x, num_samples=5, return_samples=True)
    assert res.samples.shape == (15, 7, 3) and res.num_samples == 15
    s = res.samples.astype(np.float64)
    np.testing.assert_allclose(res.mean_probs, s.mean(axis=0), atol=1e-6)
    np.testing.assert_allclose(res.expected_entropy, _entropy(s).mean(axis=0), rtol=1e-5)
    assert np.all(np.abs(np.diff(s, axis=0)).max(axis=(1, 2)) > 1e-6)  # 15 distinct samples
    # In posterior-mean mode block m holds member m's mean prediction T times (member-major order).
    with tfbnn.posterior_mean(ensemble):
        means = tfbnn.predict(ensemble, x, num_samples=5, return_samples=True)
        each = np.stack([m.predict(x, verbose=0) for m in members])
    np.testing.assert_allclose(means.samples.reshape(3, 5, 7, 3), np.repeat(each[:, None], 5, axis=1), atol=1e-6)
    np.testing.assert_allclose(means.mean_probs, each.mean(axis=0), atol=1e-6)


def test_stacked_and_parallel_evaluation_agree():
    x = _x()
    members = [_dense_member(s) for s in (0, 1, 2)]
    parallel = tfbnn.DeepEnsemble(members).call_members(x).numpy()
    stacked = tfbnn.DeepEnsemble(members, vectorize="stacked").call_members(x).numpy()
    assert stacked.shape == (3, 12, 3)
    np.testing.assert_allclose(stacked, parallel, atol=1e-6)
    np.testing.assert_allclose(stacked, np.stack([m.predict(x, verbose=0) for m in members]), atol=1e-6)


@pytest.mark.parametrize("vectorize", ["parallel", "stacked"])
def test_save_and_load_keep_every_member(tmp_path, vectorize):
    x = _x()
    members = [_dense_member(s) for s in (0, 1000, 2000)]
    ensemble = tfbnn.DeepEnsemble(members, vectorize=vectorize, name="ens")
    path = os.path.join(tmp_path, "ensemble.keras")
    ensemble.save(path)
    loaded = keras.saving.load_model(path)
    assert isinstance(loaded, tfbnn.DeepEnsemble) and loaded.num_members == 3 and loaded.vectorize == vectorize
    np.testing.assert_allclose(loaded.call_members(x).numpy(), ensemble.call_members(x).numpy(), atol=1e-7)
    np.testing.assert_allclose(tfbnn.predict(loaded, x).mean_probs, tfbnn.predict(ensemble, x).mean_probs, atol=1e-7)


def test_bayesian_ensemble_saves_and_reproduces_its_samples(tmp_path):
    x = _x(6)
    ensemble = tfbnn.DeepEnsemble([_bayesian_member(s) for s in (0, 1000)])
    ensemble(x)
    path = os.path.join(tmp_path, "bayes.keras")
    ensemble.save(path)
    first = tfbnn.predict(keras.saving.load_model(path), x, num_samples=4, return_samples=True).samples
    again = tfbnn.predict(keras.saving.load_model(path), x, num_samples=4, return_samples=True).samples
    np.testing.assert_array_equal(first, again)  # the saved seed states replay
    with tfbnn.posterior_mean(ensemble):
        expected = ensemble.predict(x, verbose=0)
    loaded = keras.saving.load_model(path)
    with tfbnn.posterior_mean(loaded):
        np.testing.assert_allclose(loaded.predict(x, verbose=0), expected, atol=1e-7)


def test_train_ensemble_gives_members_that_differ_and_reproduce():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 5)).astype("float32")
    y = (x[:, 0] + x[:, 1] > 0).astype("int32")

    def build(seed):
        return tfbnn.models.build("mlp", method="deterministic", hidden_units=(8,), num_classes=2, input_shape=(5,),
                                  seed=seed)

    kwargs = dict(compile_kwargs={"optimizer": "adam", "loss": "sparse_categorical_crossentropy"}, epochs=2,
                  batch_size=16, verbose=0)
    ensemble, histories = ensembles.train_ensemble(build, 3, x, y, seed=5, return_histories=True, **kwargs)
    assert ensemble.num_members == 3 and len(histories) == 3
    kernels = [m.trainable_variables[0].numpy() for m in ensemble.members]
    assert min(np.abs(kernels[i] - kernels[j]).max() for i in range(3) for j in range(i + 1, 3)) > 1e-2
    outputs = ensemble.call_members(x).numpy()
    assert np.abs(outputs[0] - outputs[1]).max() > 1e-3
    again = ensembles.train_ensemble(build, 3, x, y, seed=5, **kwargs)
    for a, b in zip(ensemble.members, again.members):
        for va, vb in zip(a.weights, b.weights):
            np.testing.assert_array_equal(va.numpy(), vb.numpy())
    assert ensembles.member_seeds(5, 3) == [5, 1005, 2005]


def test_bad_arguments_name_what_is_wrong():
    member = _dense_member(0)
    for members, match in [([], r"members=\[\]"), (member, "list of Keras models"),
                           ([member, "x"], r"members\[1\] of type str"), ([member, member], "distinct")]:
        with pytest.raises(ValueError, match=match):
            tfbnn.DeepEnsemble(members)
    with pytest.raises(ValueError, match="vectorize='loop'"):
        tfbnn.DeepEnsemble([member], vectorize="loop")
    with pytest.raises(ValueError, match="stochastic layers"):
        tfbnn.DeepEnsemble([_bayesian_member(0), _bayesian_member(1)], vectorize="stacked")
    wide = keras.Sequential([keras.Input((5,)), keras.layers.Dense(3, activation="softmax")])
    with pytest.raises(ValueError, match="share an architecture"):
        tfbnn.DeepEnsemble([member, wide], vectorize="stacked")
    ensemble = tfbnn.DeepEnsemble([member, _dense_member(1)])
    ensemble.compile("adam", "sparse_categorical_crossentropy")
    with pytest.raises(ValueError, match="train its members"):
        ensemble.fit(_x(), np.zeros(12, "int32"), verbose=0)
    with pytest.raises(ValueError, match="num_members=0"):
        ensembles.member_seeds(0, 0)
    with pytest.raises(ValueError, match="build_fn"):
        ensembles.train_ensemble("mlp", 2, _x(), np.zeros(12))
    with pytest.raises(ValueError, match="optimizer"):
        ensembles.train_ensemble(_dense_member, 2, _x(), np.zeros(12),
                                 compile_kwargs={"optimizer": keras.optimizers.Adam(), "loss": "mse"})


@pytest.mark.heavy
def test_the_uncertainty_comparison_runs_in_quick_mode(tmp_path, capsys):
    import csv
    import json

    from tfbnn import cli

    out = tmp_path / "cmp"
    assert cli.main(["uncertainty-comparison", "--quick", "--num-samples", "4", "--output-dir", str(out)]) == 0
    for name in ("comparison.csv", "comparison.json", "comparison.md", "comparison.png"):
        assert (out / name).stat().st_size > 0, name
    rows = json.loads((out / "comparison.json").read_text())["rows"]
    assert [r["method"] for r in rows] == ["deterministic", "MC dropout", "BbB", "iBNN", "deep ensemble"]
    by = {r["method"]: r for r in rows}
    # No epistemic uncertainty without a posterior: every score ties, the detector is at chance.
    assert by["deterministic"]["epistemic_clean"] == pytest.approx(0.0, abs=1e-6)
    assert by["deterministic"]["auroc_epistemic"] == 0.5
    assert by["deep ensemble"]["epistemic_clean"] > 0 and by["deep ensemble"]["num_samples"] == 2  # 2 members
    for r in rows:
        assert 0 <= r["accuracy"] <= 1 and 0 <= r["auroc_total"] <= 1 and r["nll"] > 0
    with open(out / "comparison.csv") as f:
        assert [r["method"] for r in csv.DictReader(f)] == list(by)
    assert (out / "comparison.md").read_text().count("\n| ") == 6  # header + 5 rows
    assert "| deep ensemble |" in capsys.readouterr().out
