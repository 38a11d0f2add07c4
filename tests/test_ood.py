"""Out-of-distribution scores (tfbnn.evaluation.ood_scores) and their detection metrics (tfbnn.metrics):
AUPR against scikit-learn, FPR at a TPR against a brute-force threshold search, the scores by hand."""

import numpy as np
import pytest
from scipy.special import logsumexp
from sklearn.metrics import average_precision_score, roc_auc_score

from tfbnn import evaluation, metrics
from tfbnn.inference import ClassificationPrediction


def _scores(seed, ties=False):
    rng = np.random.default_rng(seed)
    neg, pos = rng.normal(size=40), rng.normal(loc=1.0, size=25)
    if ties:
        neg, pos = np.round(neg, 1), np.round(pos, 1)
    return neg, pos


@pytest.mark.parametrize("seed,ties", [(0, False), (1, True), (2, True)])
def test_aupr_and_auroc_are_scikit_learns(seed, ties):
    neg, pos = _scores(seed, ties)
    labels, stacked = np.r_[np.zeros(len(neg)), np.ones(len(pos))], np.r_[neg, pos]
    assert metrics.aupr(neg, pos) == pytest.approx(average_precision_score(labels, stacked), abs=1e-12)
    assert metrics.auroc(neg, pos) == pytest.approx(roc_auc_score(labels, stacked), abs=1e-12)


@pytest.mark.parametrize("seed,ties,tpr", [(0, False, 0.95), (1, True, 0.95), (2, True, 0.5), (3, False, 1.0)])
def test_fpr_at_tpr_is_the_brute_force_threshold_search(seed, ties, tpr):
    neg, pos = _scores(seed, ties)
    # every candidate threshold; the largest that still flags >= tpr of the positives
    threshold = max(t for t in np.r_[neg, pos] if np.mean(pos >= t) >= tpr)
    assert metrics.fpr_at_tpr(neg, pos, tpr) == np.mean(neg >= threshold)


def test_perfect_and_chance_separation():
    assert metrics.fpr_at_tpr([0.0, 0.1], [0.5, 0.9]) == 0.0
    assert metrics.aupr([0.0, 0.1], [0.5, 0.9]) == 1.0
    same = np.zeros(10)
    assert metrics.aupr(same, same) == 0.5 and metrics.fpr_at_tpr(same, same) == 1.0


def _prediction(seed, confident):
    rng = np.random.default_rng(seed)
    base = rng.normal(scale=4.0 if confident else 0.3, size=(1, 50, 4))  # each input's own logits
    logits = base + rng.normal(scale=0.3 if confident else 1.0, size=(6, 50, 4))  # T = 6 samples: (T, B, C)
    samples = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    mean = samples.mean(0)
    h = lambda p: -np.sum(p * np.log(p), axis=-1)  # noqa: E731
    return ClassificationPrediction(mean, h(mean), h(samples).mean(0), h(mean) - h(samples).mean(0),
                                    samples=samples, num_samples=6), logits.mean(0)


def test_the_scores_by_hand():
    res, logits = _prediction(0, confident=True)
    density, variance = np.linspace(-3.0, 1.0, 50), np.linspace(0.1, 2.0, 50)
    scores = evaluation.ood_scores(res, logits=logits, temperature=2.0, log_density=density, gp_variance=variance)
    assert set(scores) == set(evaluation.OOD_SCORES)
    np.testing.assert_array_equal(scores["ddu_density"], -density)  # higher: more likely OOD
    np.testing.assert_array_equal(scores["sngp_variance"], variance)
    np.testing.assert_allclose(scores["msp"], 1 - res.mean_probs.max(1))
    np.testing.assert_allclose(scores["predictive_entropy"], res.predictive_entropy, rtol=1e-10)
    np.testing.assert_allclose(scores["mutual_information"], res.mutual_information)
    np.testing.assert_allclose(scores["max_logit"], -logits.max(1))
    np.testing.assert_allclose(scores["energy"], -2.0 * logsumexp(logits / 2.0, axis=1), rtol=1e-12)
    votes = res.samples.argmax(-1)
    by_hand = [1 - np.bincount(votes[:, b], minlength=4).max() / 6 for b in range(50)]
    np.testing.assert_allclose(scores["variation_ratio"], by_hand)
    assert set(evaluation.ood_scores(ClassificationPrediction(res.mean_probs, None, None, None))) == {
        "msp", "predictive_entropy"}


def test_detection_tells_unsure_inputs_from_confident_ones():
    (sure, sure_logits), (unsure, unsure_logits) = _prediction(1, True), _prediction(2, False)
    table = evaluation.ood_detection(evaluation.ood_scores(sure, sure_logits),
                                     evaluation.ood_scores(unsure, unsure_logits))
    for name in ("msp", "predictive_entropy", "mutual_information", "variation_ratio"):
        assert table[name]["auroc"] > 0.9 and table[name]["fpr_at_95_tpr"] < 0.5, (name, table[name])
    assert table["energy"]["auroc"] > 0.7  # from the mean logits alone: better than chance, less sharp here


@pytest.mark.parametrize("call,match", [
    (lambda: metrics.fpr_at_tpr([0.1], [0.2], tpr=0.0), r"`tpr`"),
    (lambda: metrics.aupr([0.1, np.nan], [0.2]), r"in_scores"),
    (lambda: evaluation.ood_detection({"msp": [0.1]}, {"energy": [0.2]}), r"same score names"),
    (lambda: evaluation.ood_scores(_prediction(0, True)[0], logits=np.zeros((3, 4))), r"`logits` of shape \(50, 4\)"),
    (lambda: evaluation.ood_scores(_prediction(0, True)[0], log_density=np.zeros(3)), r"`log_density` of shape"),
    (lambda: evaluation.ood_scores(_prediction(0, True)[0], gp_variance=np.full(50, np.nan)), r"gp_variance"),
])
def test_bad_input_is_named(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_single_pass_scores_flag_a_held_out_digit():
    """The wiring of ``ddu_density`` and ``sngp_variance`` on the digits 0-8, the digit 9 held out: DDU on a
    spectrally normalized softmax net (Mukhoti et al.'s setting), the variance of an SNGP net."""
    import keras

    import tfbnn
    from tfbnn import ddu, sngp
    from tfbnn.layers import SpectralDense

    keras.utils.set_random_seed(0)
    data = tfbnn.datasets.load_digits(seed=0)
    known = data.y_train < 9
    x, y = data.x_train[known], data.y_train[known]
    x_in, x_out = data.x_test[data.y_test < 9], data.x_test[data.y_test == 9]
    softmax_net = keras.Sequential([keras.Input((64,)), SpectralDense(32, activation="relu", seed=0),
                                    keras.layers.Dense(9, activation="softmax")])
    # The Gaussian precision weights (the default) and a normalized GP input: with the logistic weights p (1 - p) the
    # confidently classified training digits add almost nothing to the precision (AUROC 0.39 over three seeds:
    # docs/guides/single-pass.md, benchmarks/sngp_precision_weights.py).
    gp_net = tfbnn.models.mlp("sngp", hidden_units=(32,), input_shape=(64,), num_classes=9, num_inducing=128, seed=0,
                              gp_cov_likelihood="gaussian", normalize_input=True)
    for model, callbacks in ((softmax_net, []), (gp_net, [sngp.ResetCovariance()])):
        model.compile(keras.optimizers.Adam(0.01), "sparse_categorical_crossentropy")
        model.fit(x, y, batch_size=64, epochs=6, verbose=0, callbacks=callbacks)
    density = ddu.DDU(softmax_net).fit(x, y)

    def scores(inputs):
        return evaluation.ood_scores(tfbnn.predict(softmax_net, inputs), log_density=density.log_density(inputs),
                                     gp_variance=sngp.predictive_variance(gp_net, inputs))

    s_in, s_out = scores(x_in), scores(x_out)
    np.testing.assert_allclose(s_out["ddu_density"], -density.log_density(x_out))
    np.testing.assert_allclose(s_out["sngp_variance"], sngp.predictive_variance(gp_net, x_out))
    table = evaluation.ood_detection(s_in, s_out)
    assert table["ddu_density"]["auroc"] > 0.8 and table["sngp_variance"]["auroc"] > 0.7, table
