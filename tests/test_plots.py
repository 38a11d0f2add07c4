import numpy as np
import pytest

from tfbnn import metrics, plots


@pytest.fixture
def classification():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(300, 4)) * 3
    probs = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
    labels = rng.integers(0, 4, size=300)
    return probs, labels


def test_reliability_diagram_shows_the_metric_ece(classification, tmp_path):
    probs, labels = classification
    fig = plots.reliability_diagram(probs, labels, num_bins=10)
    ax = fig.axes[0]
    d = metrics.reliability_diagram(probs, labels, 10)
    accuracy_bars = [p for p in ax.patches if p.get_facecolor()[:3] == pytest.approx((0.12, 0.47, 0.71), abs=0.01)]
    assert len(accuracy_bars) == int((d.count > 0).sum())
    np.testing.assert_allclose(sorted(p.get_height() for p in accuracy_bars), sorted(d.accuracy[d.count > 0]))
    assert f"ECE = {metrics.expected_calibration_error(probs, labels, 10):.4f}" in [t.get_text() for t in ax.texts]
    path = plots.save(fig, str(tmp_path / "sub" / "rel.png"))
    assert open(path, "rb").read(8) == b"\x89PNG\r\n\x1a\n"


def test_other_figures_render(classification, tmp_path):
    probs, labels = classification
    x = np.linspace(-1, 1, 50)
    figs = {
        "bands": plots.regression_bands(x[::5], x[::5] ** 3, x, x**3, 0.1 + 0 * x, 0.2 + 0 * x,
                                        samples=np.stack([x**3] * 3), true_fn=lambda v: v**3),
        "hist": plots.entropy_histograms(np.full(10, 0.1), np.full(10, 1.0)),
        "coverage": plots.accuracy_coverage({"a": metrics.selective_prediction(probs, labels)}),
        "shift": plots.uncertainty_vs_shift(
            {"bbb": [{"level": l, "accuracy": 1 - l, "predictive_entropy": l, "expected_entropy": l / 2,
                      "mutual_information": l / 2} for l in (0.0, 0.5, 1.0)]}),
        "curves": plots.learning_curves({"loss": [3, 2, 1], "val_loss": [3.5, 2.5, 2], "accuracy": [0.5, 0.7, 0.8]}),
    }
    # The band's upper edge is mean + 2 * total std.
    band = figs["bands"].axes[0].collections[0].get_paths()[0].vertices
    assert band[:, 1].max() == pytest.approx(1 + 0.4, abs=1e-6)
    assert len(figs["shift"].axes[0].lines) == 3 and len(figs["curves"].axes) == 2
    for name, fig in figs.items():
        assert (tmp_path / f"{name}.png").exists() is False
        plots.save(fig, str(tmp_path / f"{name}.png"))
        assert (tmp_path / f"{name}.png").stat().st_size > 1000
