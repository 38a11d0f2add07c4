"""Bad input in the newer entry points (issue 36, item 8): each case gives a clear error naming the argument.

The command-line cases exit with status 2 (a bad argument) in one ``tfbnn: error: ...`` line, and a run
refused this way leaves no folder behind.
"""

import os
import zipfile

import keras
import numpy as np
import pytest

import tfbnn
from tfbnn import conformal, evaluation, moments
from tfbnn.datasets import corruptions


# -- conformal sets ------------------------------------------------------------------------------
SETS = np.array([[True, False, False], [True, True, False]])


@pytest.mark.parametrize("labels, shown", [([-1, 0], "min=-1"), ([0.7, 0.0], "dtype float64"),
                                           ([0, 3], "max=3"), ([0, 1, 2], r"shape \(3,\)")])
def test_coverage_refuses_labels_that_are_not_classes_of_the_sets(labels, shown):
    with pytest.raises(ValueError, match=rf"Expected `y` of shape \(2,\), ints in \[0, 3\) \(one class per row of `lower_or_sets`\)\. Received: y .*{shown}"):
        conformal.coverage(labels, SETS)
    assert conformal.coverage([0, 1], SETS) == 1.0
    assert conformal.coverage(np.array([2, 0], np.int8), SETS) == 0.5


def test_coverage_refuses_sets_that_are_not_membership_matrices():
    with pytest.raises(ValueError, match=r"Expected `lower_or_sets` to be a boolean \(m, C\) set matrix"):
        conformal.coverage([0, 1], [[np.nan, 1.0], [0.0, 1.0]])
    with pytest.raises(ValueError, match=r"Received: lower_or_sets of shape \(0, 3\)"):
        conformal.coverage([], np.zeros((0, 3), bool))


def test_a_conformal_classifier_refuses_probabilities_over_other_classes():
    probs = np.array([[0.7, 0.2, 0.1], [0.1, 0.8, 0.1], [0.2, 0.2, 0.6]])
    sets = conformal.ConformalClassifier(0.2, "lac").fit(probs, [0, 1, 2])
    assert sets.num_classes == 3
    with pytest.raises(ValueError, match=r"Expected `probs` over the 3 classes the sets were calibrated on\. "
                                         r"Received: probs.shape=\(1, 4\)"):
        sets.predict(np.full((1, 4), 0.25))
    assert sets.predict(probs).shape == (3, 3)


# -- moments -------------------------------------------------------------------------------------
def _classifier():
    model = keras.Sequential([keras.Input((4,)), tfbnn.DenseFlipout(3, activation="softmax", seed=1)])
    model(np.zeros((1, 4), "float32"))
    return model


def test_propagate_refuses_inputs_of_another_shape_naming_them():
    with pytest.raises(ValueError, match=r"Expected `inputs` shaped like the model's input \(None, 4\)\. "
                                         r"Received: inputs with shapes \[\(2, 5\)\]"):
        moments.propagate(_classifier(), np.zeros((2, 5), "float32"))


def test_predict_with_moments_refuses_inputs_of_another_shape_as_monte_carlo_does():
    model = _classifier()
    for method in ("monte_carlo", "moments"):
        with pytest.raises(ValueError, match=r"Expected `x` shaped like the model's input \(None, 4\)\. "
                                             r"Received: x with shapes \[\(2, 5\)\]"):
            tfbnn.predict(model, np.zeros((2, 5), "float32"), num_samples=2, method=method)


def test_propagate_refuses_nan_inputs_as_predict_does():
    x = np.zeros((3, 4), "float32")
    x[1, 2] = np.nan
    model = _classifier()
    with pytest.raises(ValueError, match=r"Expected finite inputs .* Received: inputs with NaN or infinite values "
                                         r"in rows \[1\]"):
        moments.propagate(model, x)
    with pytest.raises(ValueError, match=r"Received: x with NaN or infinite values in rows \[1\]"):
        tfbnn.predict(model, x, method="moments")
    x[1, 2] = 0.0
    assert np.all(np.isfinite(moments.propagate(model, x).mean))


# -- corruptions ---------------------------------------------------------------------------------
def test_corrupt_images_refuses_a_batch_size_below_one():
    images = np.full((2, 8, 8, 1), 0.5, "float32")
    for batch_size in (0, -1, 2.5, "2"):
        with pytest.raises(ValueError, match=rf"Expected `batch_size` to be a positive integer\. "
                                             rf"Received: batch_size={batch_size!r}"):
            corruptions.corrupt_images(images, "contrast", 1, batch_size=batch_size)
    assert corruptions.corrupt_images(images, "contrast", 1, batch_size=np.int64(1)).shape == (2, 8, 8, 1)


@pytest.mark.parametrize("corrupt", [lambda x: corruptions.gaussian_noise(x, 0.1, seed=0),
                                     lambda x: corruptions.salt_and_pepper(x, 0.1, seed=0)])
def test_corruptions_refuse_nan_inputs(corrupt):
    x = np.full((2, 3), 0.5, "float32")
    x[1, 0] = np.nan
    with pytest.raises(ValueError, match=r"Expected `x` to hold finite numbers\. Received: x with 1 NaN or infinite "
                                         r"values \(the first at index \(1, 0\)\)"):
        corrupt(x)


def test_salt_and_pepper_names_a_low_that_is_no_number():
    with pytest.raises(ValueError, match=r"Expected `low` to be a finite number\. Received: low='0'"):
        corruptions.salt_and_pepper(np.zeros(3), 0.1, low="0")


# -- OOD detection -------------------------------------------------------------------------------
def test_ood_detection_refuses_arrays_saying_what_it_takes():
    with pytest.raises(ValueError, match=r"Expected `in_scores` to be a dict of score name -> \(n,\) scores, as "
                                         r"ood_scores returns \(for one score array a: \{'score': a\}\)\. "
                                         r"Received: in_scores of type ndarray"):
        evaluation.ood_detection(np.array([0.1, 0.2]), np.array([0.3, 0.4]))
    with pytest.raises(ValueError, match=r"Received: out_scores of type dict \(empty\)"):
        evaluation.ood_detection({"msp": [0.1]}, {})
    with pytest.raises(ValueError, match=r"Expected `tpr` to be a true-positive rate in \(0, 1\]\. Received: tpr='x'"):
        evaluation.ood_detection({"msp": [0.1]}, {"msp": [0.2]}, tpr="x")
    numbers = evaluation.ood_detection({"score": np.array([0.1, 0.2])}, {"score": np.array([0.3, 0.15])},
                                       tpr=np.float32(0.5))
    assert numbers["score"]["auroc"] == 0.75


# -- the command ---------------------------------------------------------------------------------
def _command(argv, capsys):
    from tfbnn.cli import main
    status = main(argv)
    return status, capsys.readouterr().err


def _saved_model(tmp_path):
    path = str(tmp_path / "m.keras")
    keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, activation="softmax")]).save(path)
    return path


@pytest.mark.parametrize("command", [["export"], ["laplace", "--data", "digits"], ["evaluate"]])
def test_a_file_that_is_not_a_keras_archive_is_a_bad_argument(command, tmp_path, capsys):
    junk = tmp_path / "junk.keras"
    junk.write_text("junk")
    status, err = _command([command[0], str(junk), *command[1:]], capsys)
    assert status == 2
    assert err == (f"tfbnn: error: argument model: expected a .keras model (a zip archive), received '{junk}', "
                   f"which is not a zip archive (see 'tfbnn {command[0]} --help')\n")


def test_a_zip_that_keras_cannot_load_is_a_bad_argument_named_model(tmp_path, capsys):
    path = tmp_path / "foreign.keras"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("notes.txt", "not a model")
    status, err = _command(["export", str(path)], capsys)
    assert status == 2 and err.count("\n") == 1
    assert err.startswith("tfbnn: error: Expected a readable .keras model (") and err.endswith(f"Received: model={path}\n")


@pytest.mark.parametrize("command", [["export"], ["laplace", "--data", "digits"]])
def test_an_output_that_cannot_be_made_names_output(command, tmp_path, capsys):
    model = _saved_model(tmp_path)
    status, err = _command([command[0], model, *command[1:], "--output", "/proc/x/y"], capsys)
    assert status == 2
    assert err == ("tfbnn: error: Expected --output in a folder that exists or can be created; '/proc/x' cannot be "
                   "created (No such file or directory). Received: --output='/proc/x/y'\n")
    (tmp_path / "afile").write_text("x")
    status, err = _command([command[0], model, *command[1:], "--output", str(tmp_path / "afile" / "y")], capsys)
    assert status == 2 and "cannot be created (a file is in the way). Received: --output=" in err
    assert sorted(os.listdir(tmp_path)) == ["afile", "m.keras"]


def test_conformal_score_without_conformalize_is_refused(tmp_path, capsys):
    model = _saved_model(tmp_path)
    status, err = _command(["evaluate", model, "--conformal-score", "aps"], capsys)
    assert status == 2
    assert err == ("tfbnn: error: --conformal-score chooses the score of --conformalize's sets. Received: "
                   "--conformal-score=aps without --conformalize\n")
    assert os.listdir(tmp_path) == ["m.keras"]


@pytest.mark.parametrize("score", [None, "lac"])
def test_conformal_nonrandomized_without_a_randomized_score_is_refused(tmp_path, capsys, score):
    model = _saved_model(tmp_path)
    status, err = _command(["evaluate", model, "--conformalize", "0.1", "--conformal-nonrandomized",
                            *(["--conformal-score", score] if score else [])], capsys)
    assert status == 2
    assert err == ("tfbnn: error: --conformal-nonrandomized applies to the randomized APS and RAPS sets. Received: "
                   f"--conformal-nonrandomized with --conformal-score={score}\n")
    assert os.listdir(tmp_path) == ["m.keras"]


def test_a_run_on_an_unknown_dataset_leaves_no_folder(tmp_path, capsys):
    out = tmp_path / "saved" / "runs" / "r"
    status, err = _command(["run", "digits-bbb-mlp", "--quick", "--dataset", "bogus", "--output-dir", str(out)],
                           capsys)
    assert status == 2 and "Received: --dataset='bogus'" in err
    assert os.listdir(tmp_path) == []


def test_train_says_which_methods_a_kerashub_model_trains_before_any_folder(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    status, err = _command(["train", "--model", "kerashub_vit", "--method", "bbb"], capsys)
    assert status == 2
    assert err.startswith("tfbnn: error: --model kerashub_vit trains with --method deterministic, mc_dropout, or "
                          "ensemble with --member-method one of them")
    assert err.endswith("Received: --model=kerashub_vit, --method=bbb\n") and "bayesian_layers='all'" not in err
    assert os.listdir(tmp_path) == []


def test_a_run_whose_model_cannot_be_built_leaves_no_folder(tmp_path):
    recipe = tfbnn.training.get_recipe("digits-bbb-mlp").quick(max_examples=32, max_test_examples=16).replace(
        model="kerashub_vit", model_options={})
    with pytest.raises(ValueError, match=r"bayesian_layers='last'"):
        tfbnn.training.run(recipe, output_dir=str(tmp_path / "a" / "b" / "run"), model_path=str(tmp_path / "m" / "x.keras"),
                           verbose=0, quiet=True, jit_compile=False)
    assert os.listdir(tmp_path) == []
