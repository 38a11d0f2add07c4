"""Runnable experiments reproducing published results with tfbnn.

A study is data: a :class:`Study` (``STUDY`` in its module) declares its settings once
(:class:`Setting`), the recipes it trains, how it trains them and its analysis; its Python
entry point (``run_experiment(...) -> dict``), its checks and its command line (``tfbnn
<name>``, ``tfbnn run <name>``, ``python -m tfbnn.experiments.<module> --help``) all come
from that declaration. :data:`STUDIES` is the one list of the studies: the ``tfbnn``
command's table, ``tfbnn run`` and ``tfbnn recipes`` read it. Results are PNG figures next
to CSV and JSON numbers, by default under ``saved_models/experiments/<name>/`` (not committed).

==============================  ====================================================
module                          experiment
==============================  ====================================================
``vd_sparsity``                 VariationalMLP sparsity study: pre-train, convert to
                                variational dropout or Graves, anneal, prune
                                (principled vs random), accuracy vs MC samples
``vd_regression``               1-D regression, 40 points: variational dropout,
                                Graves and deterministic predictive bands
``vd_transformer``              Transformer-encoder text classifier (IMDB via tfds or
                                offline synthetic reviews) with a VD / BbB
                                feed-forward block
``cifar_comparison``            LeNet-5 / AlexNet / ResNet-50 on CIFAR-10 with
                                Bayes-by-Backprop, MC dropout, ... (learning curves,
                                accuracy, NLL, ECE)
``ibnn_regression``             iBNN (Trinh et al. 2022): y = x^3 from 30 points,
                                1-5 hidden layers of 256 ReLU units, iBNN vs
                                Bayes-by-Backprop predictive bands
``ibnn_lenet``                  LeNet size sweep (parameters x1, x4, x16, x64) iBNN vs BbB on
                                Fashion-MNIST (tfds) or the offline 8x8 digits
``ibnn_shift``                  accuracy and total / aleatoric / epistemic uncertainty
                                under growing input corruption: iBNN vs MC dropout
``uncertainty_comparison``      deterministic, MC dropout, BbB, iBNN and a deep
                                ensemble on the same data: accuracy, NLL, ECE, Brier,
                                epistemic clean vs shifted, AUROC of detecting the
                                shift (one table)
``posterior_comparison``        MAP, MC dropout, BbB (three estimators), VD, iBNN, a deep
                                ensemble, Laplace and SWAG against an HMC reference:
                                1-D in-between uncertainty, diabetes, breast cancer
``vcl_split_digits``            continual learning on split digits (5 class-pair tasks):
                                variational continual learning (posterior as the next
                                prior) vs fine-tuning; accuracy matrices, forgetting
``shift_benchmark``             deterministic, MC dropout, BbB, VD, iBNN, ensemble,
                                Laplace, SWAG under 10 image corruptions x 5
                                severities, OOD classes / synthetic inputs, conformal
                                coverage under shift (one table, plots)
``kerashub_finetune``           tiny KerasHub BERT (synthetic reviews) and ViT
                                (digits) fine-tuned, then MAP, last-layer Laplace,
                                BbB head, Laplace-LoRA, BLoB, MC dropout, an ensemble
                                of heads: accuracy, NLL, ECE, OOD AUROC (one table)
==============================  ====================================================
"""

from tfbnn.experiments._study import Setting, Study

__all__ = ["STUDIES", "Setting", "Study"]

#: Every study: command name -> (module, the one-line summary of ``tfbnn --help`` and ``tfbnn recipes``),
#: in the order they are listed. Importing this table imports no study.
STUDIES = {
    "vd-sparsity": ("tfbnn.experiments.vd_sparsity",
                    "sparsity study: pre-train, convert (vd | graves), anneal, prune vs random"),
    "vd-regression": ("tfbnn.experiments.vd_regression",
                      "1-D regression bands: variational dropout vs Graves vs deterministic"),
    "vd-transformer": ("tfbnn.experiments.vd_transformer",
                       "Transformer text classifier with a VD / BbB feed-forward block (IMDB)"),
    "ibnn-regression": ("tfbnn.experiments.ibnn_regression",
                        "iBNN vs Bayes-by-Backprop on y = x^3 with 1-5 hidden layers (bands + CSV)"),
    "ibnn-lenet": ("tfbnn.experiments.ibnn_lenet",
                   "LeNet width sweep (1x-64x) of iBNN vs Bayes-by-Backprop (plot + CSV)"),
    "ibnn-shift": ("tfbnn.experiments.ibnn_shift",
                   "uncertainty under input corruption: iBNN vs MC dropout (plots + CSV)"),
    "uncertainty-comparison": ("tfbnn.experiments.uncertainty_comparison",
                               "one table: deterministic, MC dropout, BbB, iBNN, deep ensemble (CSV/MD + PNG)"),
    "posterior-comparison": ("tfbnn.experiments.posterior_comparison",
                             "MAP, MC dropout, BbB x3, VD, iBNN, ensemble, Laplace, SWAG vs HMC (1-D gap + sklearn)"),
    "vcl-split-digits": ("tfbnn.experiments.vcl_split_digits",
                         "split digits: VCL (posterior as prior) vs fine-tuning; forgetting table + plots"),
    "shift-benchmark": ("tfbnn.experiments.shift_benchmark",
                        "every method under 10 corruptions x 5 severities, OOD AUROC, conformal coverage (table + plots)"),
    "kerashub-finetune": ("tfbnn.experiments.kerashub_finetune",
                          "tiny KerasHub BERT / ViT fine-tuned: MAP, Laplace, BbB head, Laplace-LoRA, BLoB, MC dropout, "
                          "ensemble (table + plot)"),
}
