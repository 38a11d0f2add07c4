"""Built-in recipes: the main job and each seed study's protocol as published.

=====================================  =====================================================
name                                   protocol (source)
=====================================  =====================================================
``digits-bbb-mlp``                     the main job (``tfbnn train``): BbB MLP 64-64, local
                                       reparameterization, N(0, 1) prior, Adam 3e-3, 60
                                       epochs, KL ramp over the first half to a tempered
                                       beta = 0.1; offline digits, 15% validation hold-out
                                       for temperature scaling
``digits-ensemble-mlp``                a deep ensemble (Lakshminarayanan et al. 2017) of 5
                                       deterministic MLPs 64-64, each trained as the main job
                                       from its own seed
``digits-csgmcmc-mlp``                 cyclical SG-MCMC (Zhang et al. 2020): the main job's
                                       deterministic MLP 64-64 sampled by SGHMC on a cyclical
                                       step size from 0.1, 4 cycles over 60 epochs, 3 samples
                                       at the end of each; predicts as their ensemble
``reviews-lstm-bbb``                   a Bayes-by-Backprop LSTM sentiment classifier (weights
                                       sampled once per sequence, Fortunato et al. 2017) on
                                       the offline synthetic reviews (``imdb_reviews``: IMDB),
                                       Adam 3e-3, 10 epochs, KL ramp to beta = 1
``digits-kerashub-vit-bbb``            a KerasHub ViT (tiny config, 2x2 patches, random
                                       weights) with a Flipout BbB head (the only Bayesian
                                       layer), trained end to end on the offline digits:
                                       Adam 1e-3, 40 epochs, batch 32, KL ramp to beta = 1,
                                       10% validation (needs ``tfbnn[hub]``)
``reviews-kerashub-bert-bbb``          a KerasHub BERT (tiny config: 2 layers, width 16) with
                                       a Flipout BbB head on the offline synthetic reviews
                                       (vocabulary 2,000, 64 tokens): Adam 1e-3, 10 epochs,
                                       KL ramp to beta = 1 (needs ``tfbnn[hub]``)
``blundell-mnist-{400,800,1200}``      Blundell et al. 2015 sec. 5.1: 2 hidden ReLU layers of
                                       400/800/1200 units, scale-mixture prior, minibatch
                                       weights pi_i = 2^(M-i)/(2^M-1) (eq. 9), plain SGD lr
                                       1e-3 (grid 1e-3..1e-5), batch 128, 600 epochs,
                                       50,000 train / 10,000 validation
``vd-lenet300-100``                    Molchanov et al. 2017 (official code,
``vd-lenet300-100-pretrained``         lenet300-100-ard.py / optpolicy.py): sparse VD on
``graves-lenet300-100``                LeNet-300-100, Adam 1e-3 flat for 100 epochs then
``graves-lenet300-100-pretrained``     linear to 0 at 200, batch 100, KL weight 0 for 5
                                       epochs then linear to 1 over 15; from random
                                       initialisation or after frequentist pre-training;
                                       Graves (2011), fixed N(0, 1) prior, under the same
                                       protocol
``ibnn-cifar10-vgg16``                 Trinh et al. 2022 (official code, README command):
                                       VGG16-small, K = 4, prior N(1, 0.3^2), means from
                                       N(1, 0.05^2), scales from |N(0.3, 0.02^2)|, SGD
                                       Nesterov 0.9, lr 0.05 flat to 50%
                                       then linear to 1% at 90%, weight decay 5e-4 (weights
                                       only), variational lr 0.05 constant, batch 128, 300
                                       epochs, KL weight linear 0 -> 1 over 200 epochs,
                                       4 training samples, 32 test samples
``cifar10-{lenet5,alexnet,resnet50}-   the CIFAR-10 comparison of BbB and MC dropout (seed
bbb`` / ``-mc_dropout``                study 004; BbB as Shridhar et al. 2019's code): BbB
                                       with Adam 1e-3, constant beta = 0.1, N(0, 0.1)
                                       prior; MC dropout with SGD lr 0.01 and rate 0.5;
                                       batch 64, 200 epochs, 20% validation
``cifar10-resnet50-rank1``             a rank-1 Bayesian ResNet-50 (CIFAR stem; Dusenberry et
                                       al. 2020): E = 4 members, prior N(1, 0.1^2) on the
                                       rank-1 factors, SGD Nesterov 0.9 lr 0.1, x0.2 at
                                       epochs 80/160/180, weight decay 1e-4 (the shared
                                       weights only), batch 128, 250 epochs, KL linear 0 -> 1
                                       over 200 epochs, 4 test samples per member
=====================================  =====================================================

Every protocol field is in the recipe (``tfbnn recipes --show NAME`` prints it);
``tests/training/test_run.py`` compares them with the published values. Where a paper
does not state a value, the recipe's ``description`` says what was chosen.
Datasets other than ``digits`` come from tensorflow-datasets (downloaded once);
``Recipe.quick()`` gives a few-step version of any recipe.
"""

import math

from tfbnn.training.recipe import Recipe, load_recipe

__all__ = ["RECIPES", "get_recipe", "recipe_names", "resolve"]

_STANDARD_NORMAL = {"class_name": "Normal", "config": {"loc": 0.0, "scale": 1.0}}
_BLUNDELL_PRIOR = {"class_name": "ScaleMixture", "config": {"pi": 0.25, "sigma1": 1.0, "sigma2": math.exp(-8.0)}}


def _blundell(units):
    return Recipe(
        name=f"blundell-mnist-{units}",
        description=(f"Bayes by Backprop, MLP 784-{units}-{units}-10 on MNIST with the scale-mixture prior "
                     "(pi, sigma1, sigma2) = (1/4, e^0, e^-8), the best point of the paper's grid in the seed "
                     "study (the paper does not name its best prior); one weight sample per step"),
        reference="Blundell et al. 2015, Weight Uncertainty in Neural Networks, sec. 5.1, eq. 9, Table 1",
        model="mlp", model_options={"hidden_units": (units, units)},
        method="bbb", method_options={"estimator": "reparameterization", "prior": _BLUNDELL_PRIOR},
        dataset="mnist", validation_fraction=1.0 / 6.0,
        optimizer="sgd", learning_rate=1e-3, epochs=600, batch_size=128,
        kl_schedule="blundell", eval_samples=10,
    )


def _molchanov(method, pretrained):
    vd = method == "vd"
    name = f"{'vd' if vd else 'graves'}-lenet300-100{'-pretrained' if pretrained else ''}"
    return Recipe(
        name=name,
        description=("sparse variational dropout (additive, Molchanov) " if vd else "Graves (2011) variational "
                     "inference with the fixed N(0, 1) prior (his MNIST prior; the adaptive prior collapses at "
                     "beta = 1; Molchanov's code has no Graves baseline: his protocol is reused) ") +
                    "on LeNet-300-100, MNIST, " +
                    ("after 20 epochs of frequentist pre-training" if pretrained else "from random initialisation"),
        reference=("Molchanov et al. 2017, Variational Dropout Sparsifies DNNs, sec. 5.1; official code "
                   "experiments/lenet/lenet300-100-ard.py and nets/optpolicy.py (lr_linear, rw_linear)"),
        model="lenet_300_100", method=method,
        method_options={"parameterization": "additive"} if vd else {"prior": _STANDARD_NORMAL},
        dataset="mnist", optimizer="adam", learning_rate=1e-3, lr_schedule="linear", lr_boundaries=(100, 200),
        lr_final=0.0, epochs=200, batch_size=100, pretrain_epochs=20 if pretrained else 0,
        kl_schedule="warmup", warmup_epochs=5, kl_epochs=15, eval_samples=10,
    )


def _ibnn_vgg16():
    return Recipe(
        name="ibnn-cifar10-vgg16",
        description=("node-based BNN (iBNN) VGG16-small (fc layers of 512, 15.2M parameters, noise on every layer's "
                     "inputs: the paper's 5,251 noise variables) on CIFAR-10, K = 4 mixture components, prior "
                     "N(1, 0.3^2), component means from N(1, 0.05^2), component scales from |N(0.3, 0.02^2)|; "
                     "the KL is the mixture-mean closed form (the command's entropy-regularized upper bound with "
                     "gamma is not reproduced) and the noise multiplies layer inputs (the command's noise_mode=out "
                     "would give 5,258 variables)"),
        reference=("Trinh et al. 2022, Tackling Covariate Shift with Node-based BNNs, sec. 6; official code "
                   "AaltoPML/node-BNN-covariate-shift README (StoVGG16 command) and models/vgg.py"),
        model="vgg16_small", method="ibnn",
        method_options={"num_components": 4, "prior_mean": 1.0, "prior_stddev": 0.3, "init_mean": 1.0,
                        "init_stddev": 0.05, "init_scale_mean": 0.3, "init_scale_stddev": 0.02},
        dataset="cifar10", optimizer="sgd", learning_rate=0.05, momentum=0.9, nesterov=True, weight_decay=5e-4,
        lr_schedule="linear", lr_boundaries=(150, 270), lr_final=0.01, variational_learning_rate=0.05,
        epochs=300, batch_size=128, kl_schedule="linear", kl_epochs=200, train_samples=4, eval_samples=32,
    )


def _cifar(model, method):
    bbb = method == "bbb"
    return Recipe(
        name=f"cifar10-{model}-{method}",
        description=(f"{model} on CIFAR-10: " + ("Bayes by Backprop, beta = 0.1 constant, prior N(0, 0.1^2)" if bbb
                     else "MC dropout (rate 0.5, kept on at test time), SGD lr 0.01")),
        reference=("seed study 004 (CIFAR-10 comparison of BbB and MC dropout on LeNet-5, AlexNet, ResNet-50); "
                   "BbB settings as Shridhar et al. 2019 (PyTorch-BayesianCNN config_bayesian.py)"),
        model=model, method=method,
        method_options=({"estimator": "local_reparameterization",
                         "prior": {"class_name": "Normal", "config": {"loc": 0.0, "scale": 0.1}}} if bbb
                        else {"rate": 0.5}),
        dataset="cifar10", validation_fraction=0.2,
        optimizer="adam" if bbb else "sgd", learning_rate=1e-3 if bbb else 0.01,
        epochs=200, batch_size=64, kl_schedule="constant", beta=0.1 if bbb else 1.0, eval_samples=32,
    )


def _rank1_resnet():
    return Recipe(
        name="cifar10-resnet50-rank1",
        description=("a rank-1 Bayesian ResNet-50 (CIFAR stem) on CIFAR-10: E = 4 members sharing every weight, "
                     "Gaussian posteriors over their rank-1 factors against N(1, 0.1^2); each member trains on its "
                     "quarter of every batch (not on the batch repeated E times, as the paper's code does); the "
                     "zoo's ResNet-50 stands in for the paper's WRN-28-10 (tfbnn.models.wide_resnet takes the same "
                     "ensemble options)"),
        reference=("Dusenberry et al. 2020, Efficient and Scalable Bayesian Neural Nets with Rank-1 Factors, sec. 5 "
                   "and appendix (CIFAR-10: SGD momentum 0.9, step decay x0.2 at 80/160/180 of 250 epochs, KL "
                   "annealed over 200 epochs, ensemble size 4)"),
        model="resnet50", model_options={"stem": "cifar", "ensemble": "rank1", "ensemble_size": 4},
        method="bbb", dataset="cifar10", optimizer="sgd", learning_rate=0.1, momentum=0.9, nesterov=True,
        weight_decay=1e-4, lr_schedule="step", lr_boundaries=(80, 160, 180), lr_decay=0.2, epochs=250,
        batch_size=128, kl_schedule="linear", kl_epochs=200, eval_samples=4,
    )


def _main_job():
    return Recipe(
        name="digits-bbb-mlp",
        description=("the main job: a small Bayes-by-Backprop MLP on the offline 8x8 digits (no download), "
                     "about a minute on 2 CPU cores; a tempered posterior, beta = 0.1 (the data counted ten times "
                     "against the prior: at beta = 1 the predictive of this MLP on ~1,200 examples is "
                     "under-confident and less accurate than a deterministic one; `tfbnn train` trains beta = 1 "
                     "beside it), temperature scaling fitted on a 15% validation hold-out"),
        reference=("Blundell et al. 2015 (Bayes by Backprop); Kingma et al. 2015 (local reparameterization); "
                   "Wenzel et al. 2020 (tempered posteriors); Guo et al. 2017 (temperature scaling)"),
        model="mlp", model_options={"hidden_units": (64, 64)},
        method="bbb", method_options={"estimator": "local_reparameterization", "prior": "normal"},
        dataset="digits", validation_fraction=0.15, optimizer="adam", learning_rate=3e-3, epochs=60, batch_size=32,
        kl_schedule="linear", beta=0.1, eval_samples=32, temperature_scaling=True,
    )


def _deep_ensemble():
    return _main_job().replace(
        name="digits-ensemble-mlp",
        description=("a deep ensemble of 5 deterministic MLPs 64-64 on the offline digits, each trained with the main "
                     "job's optimizer (Adam 3e-3, 60 epochs, batch 32) from its own seed (initialization and data "
                     "order); no hold-out, no temperature scaling"),
        reference="Lakshminarayanan et al. 2017, Simple and Scalable Predictive Uncertainty Estimation using Deep "
                  "Ensembles, sec. 2.4 (M = 5, uniform mixture; without adversarial training)",
        method="ensemble", method_options={"members": 5, "member_method": "deterministic"},
        validation_fraction=0.0, beta=1.0, temperature_scaling=False,
    )


def _csgmcmc():
    return _main_job().replace(
        name="digits-csgmcmc-mlp",
        description=("cyclical SG-MCMC on the main job's deterministic MLP 64-64 and offline digits: SGHMC (momentum "
                     "0.9) on a cyclical cosine step size from 0.1, 4 cycles over 60 epochs, the first 80% of each "
                     "cycle exploring, 3 samples at the end of each, a N(0, 1) prior, T = 1; predicts as the "
                     "ensemble of its 12 samples; no hold-out, no temperature scaling"),
        reference="Zhang, Li, Zhang, Chen, Wilson 2020, Cyclical Stochastic Gradient MCMC for Bayesian Deep Learning "
                  "(cSGHMC, eq. 1; M = 4 cycles, beta = 0.8, 3 samples per cycle); Chen et al. 2014 (SGHMC)",
        method="csgmcmc", method_options={"sampler": "sghmc", "cycles": 4, "samples_per_cycle": 3},
        optimizer="sgd", learning_rate=0.1, validation_fraction=0.0, beta=1.0, kl_schedule="constant",
        eval_samples=1, temperature_scaling=False,
    )


def _sentiment():
    return Recipe(
        name="reviews-lstm-bbb",
        description=("a Bayes-by-Backprop LSTM sentiment classifier (embedding 32, 32 units, one weight sample per "
                     "review held over its time steps, Flipout head) on the offline synthetic reviews (2,000 "
                     "generated reviews, 10% validation); `dataset=\"imdb_reviews\"` trains it on IMDB "
                     "(downloads once), `method=\"mc_dropout\"` / `\"deterministic\"` gives the other variants; "
                     "KL ramp over the first half to beta = 1; test shift: half of the tokens replaced at random"),
        reference=("Fortunato, Blundell, Vinyals 2017, Bayesian Recurrent Neural Networks, sec. 3 (weights sampled "
                   "once per sequence); Blundell et al. 2015 (Bayes by Backprop)"),
        model="rnn_classifier",
        model_options={"cell": "lstm", "vocab_size": 2_000, "max_length": 64, "embed_dim": 32, "units": 32},
        method="bbb", method_options={"estimator": "flipout", "prior": "normal"},
        dataset="synthetic_reviews", validation_fraction=0.1, optimizer="adam", learning_rate=3e-3,
        epochs=10, batch_size=32, kl_schedule="linear", beta=1.0, eval_samples=16,
    )


_KERASHUB_REFERENCE = ("Blundell et al. 2015, Weight Uncertainty in Neural Networks (Bayes by Backprop, eq. 2) on the "
                       "head; Kristiadi, Hein, Hennig 2020, Being Bayesian, Even Just a Bit, Fixes Overconfidence "
                       "in ReLU Networks (a Bayesian last layer); issue 30's study `tfbnn kerashub-finetune`")


def _kerashub_vit():
    return Recipe(
        name="digits-kerashub-vit-bbb",
        description=("a KerasHub ViT (ViTBackbone from a tiny config: 2x2 patches of the offline 8x8 digits, 1 "
                     "layer, 2 heads, width 16, MLP 32, dropout 0.1; random weights, no download) with a Bayes-by-"
                     "Backprop Flipout head (N(0, 1) prior, the only Bayesian layer: bayesian_layers='last'), "
                     "trained end to end from its initialization: Adam 1e-3, 40 epochs, batch 32, KL ramp over "
                     "the first half to beta = 1, 10% validation; the model option `preset` fine-tunes a "
                     "pretrained KerasHub ViT instead (224x224x3 images, downloads once)"),
        reference=_KERASHUB_REFERENCE + "; Dosovitskiy et al. 2021 (ViT)",
        model="kerashub_vit",
        model_options={"patch_size": 2, "num_layers": 1, "num_heads": 2, "hidden_dim": 16, "mlp_dim": 32,
                       "dropout": 0.1, "bayesian_layers": "last"},
        method="bbb", method_options={"estimator": "flipout", "prior": "normal"},
        dataset="digits", validation_fraction=0.1, optimizer="adam", learning_rate=1e-3, epochs=40, batch_size=32,
        kl_schedule="linear", beta=1.0, eval_samples=32,
    )


def _kerashub_bert():
    return Recipe(
        name="reviews-kerashub-bert-bbb",
        description=("a KerasHub BERT (BertBackbone from a tiny config: 2 layers, 2 heads, width 16, feed-forward "
                     "32, dropout 0.1; random weights) with a Bayes-by-Backprop Flipout head (N(0, 1) prior, "
                     "bayesian_layers='last') on the offline synthetic reviews (2,000 generated reviews, "
                     "vocabulary 2,000, 64 tokens, 10% validation), trained end to end: Adam 1e-3, 10 epochs, "
                     "batch 32, KL ramp over the first half to beta = 1; test shift: half of the tokens replaced "
                     "at random"),
        reference=_KERASHUB_REFERENCE + "; Devlin et al. 2019 (BERT)",
        model="kerashub_bert",
        model_options={"vocab_size": 2_000, "max_length": 64, "num_layers": 2, "num_heads": 2, "hidden_dim": 16,
                       "intermediate_dim": 32, "dropout": 0.1, "bayesian_layers": "last"},
        method="bbb", method_options={"estimator": "flipout", "prior": "normal"},
        dataset="synthetic_reviews", validation_fraction=0.1, optimizer="adam", learning_rate=1e-3,
        epochs=10, batch_size=32, kl_schedule="linear", beta=1.0, eval_samples=16,
    )


def _all():
    recipes = [_main_job(), _deep_ensemble(), _csgmcmc(), _sentiment(), _kerashub_vit(), _kerashub_bert()]
    recipes += [_blundell(u) for u in (400, 800, 1200)]
    recipes += [_molchanov(m, p) for m in ("vd", "graves") for p in (False, True)]
    recipes.append(_ibnn_vgg16())
    recipes += [_cifar(m, meth) for m in ("lenet5", "alexnet", "resnet50") for meth in ("bbb", "mc_dropout")]
    recipes.append(_rank1_resnet())
    return {r.name: r for r in recipes}


#: Built-in recipe name -> :class:`Recipe`.
RECIPES = _all()


def recipe_names():
    """The built-in recipe names, in the order of the table above."""
    return list(RECIPES)


def get_recipe(name):
    """The built-in recipe ``name``.

    Raises:
        ValueError: an unknown name (the message lists the known ones).
    """
    if not isinstance(name, str) or name not in RECIPES:
        raise ValueError(f"Unknown recipe. Expected one of {recipe_names()} or a .json file. Received: recipe={name!r}")
    return RECIPES[name]


def resolve(recipe):
    """A :class:`Recipe` from a recipe, a built-in name or a JSON file path."""
    if isinstance(recipe, Recipe):
        return recipe
    if isinstance(recipe, str) and recipe.endswith(".json"):
        return load_recipe(recipe)
    return get_recipe(recipe)
