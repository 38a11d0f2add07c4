"""Draws the home page's picture, the main job's reliability diagram: ``docs/assets/reliability.png``.

Run the main job first (``tfbnn train``: it saves ``saved_models/bbb_mlp_digits.keras``), then
``python docs/home_picture.py``. The diagram is the model's 32-sample Monte Carlo predictive on the
bundled digits' test split (``tfbnn.datasets.load("digits")``), before temperature scaling.
"""

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL = os.path.join(ROOT, "saved_models", "bbb_mlp_digits.keras")
PICTURE = os.path.join(ROOT, "docs", "assets", "reliability.png")


def main():
    import keras

    import tfbnn

    if not os.path.isfile(MODEL):
        print(f"{MODEL} is missing: run `tfbnn train` first")
        return 1
    model = keras.saving.load_model(MODEL)
    ds = tfbnn.datasets.load("digits")
    res = tfbnn.predict(model, ds.x_test, num_samples=32)  # the layers draw from their saved seeds
    fig = tfbnn.plots.reliability_diagram(res.mean_probs, ds.y_test,
                                          title="tfbnn train: Bayes by Backprop, digits test split")
    os.makedirs(os.path.dirname(PICTURE), exist_ok=True)
    tfbnn.plots.save(fig, PICTURE)
    print(f"Wrote {PICTURE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
