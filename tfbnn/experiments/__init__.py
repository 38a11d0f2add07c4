"""Runnable experiments reproducing published results with tfbnn.

Each module has a Python entry point (``run_experiment(...) -> dict``), a command line
(``python -m tfbnn.experiments.<module> --help``) and, for the ``tfbnn`` command, the
``DESCRIPTION``, ``add_arguments(parser)`` and ``run(args)`` that :data:`tfbnn.cli.COMMANDS`
names it by. Results are PNG figures next to CSV and JSON
numbers, by default under ``saved_models/experiments/<name>/`` (not committed).

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
==============================  ====================================================
"""
