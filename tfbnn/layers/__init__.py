"""tfbnn layers: Keras 3 layers with distributions over their weights.

A weight layer is a posterior family and a shape family. The bases to build new
layers on: :class:`StochasticLayer` (seeded noise, the sampling switch, the Monte
Carlo protocol), :class:`BayesianLayer` (a KL term scaled by ``kl_weight``),
:class:`MeanFieldGaussian` (the Bayes-by-Backprop posterior over a kernel and a bias, with
:class:`MeanFieldFlipout` its Flipout estimator:
a subclass gives its weights' shapes and its operation) and the shape families
:class:`DenseArguments` and :class:`ConvArguments` (``units``; the arguments of a
Keras convolution of any rank), which give a posterior its shapes and its operation.
"""

from tfbnn.layers.base import BayesianLayer, StochasticLayer
from tfbnn.layers.mean_field import MeanFieldFlipout, MeanFieldGaussian
from tfbnn.layers.arguments import ConvArguments, ConvTransposeArguments, DenseArguments
from tfbnn.layers.conv_gradient import conv_input_gradient, set_conv_input_gradient
from tfbnn.likelihoods import (
    BernoulliHead,
    CategoricalHead,
    DistributionLambdaHead,
    GaussianHead,
    MixtureNormalHead,
    StudentTHead,
)
from tfbnn.layers.mc_dropout import MCDropout, MCSpatialDropout2D
from tfbnn.layers.heteroscedastic import HeteroscedasticSoftmax
from tfbnn.layers.conv import (
    Conv1DFlipout,
    Conv1DReparameterization,
    Conv2DFlipout,
    Conv2DReparameterization,
    Conv2DTransposeFlipout,
    Conv2DTransposeReparameterization,
    Conv3DFlipout,
    Conv3DReparameterization,
    Conv1DTransposeFlipout,
    Conv1DTransposeReparameterization,
    Conv3DTransposeFlipout,
    Conv3DTransposeReparameterization,
)
from tfbnn.layers.dense import DenseFlipout, DenseLocalReparameterization, DenseReparameterization
from tfbnn.layers.graves import GravesDense
from tfbnn.layers.recurrent import (
    GRUCellReparameterization,
    GRUReparameterization,
    LSTMCellReparameterization,
    LSTMReparameterization,
)
from tfbnn.layers.node import NodeConv1D, NodeConv2D, NodeDense, NodeNoise
from tfbnn.layers.node_flow import NodeConv2DFlow, NodeDenseFlow
from tfbnn.layers.variational import DenseVariational
from tfbnn.layers.embedding import EmbeddingReparameterization
from tfbnn.layers.rank1 import (
    Conv2DBatchEnsemble,
    Conv2DRank1,
    DenseBatchEnsemble,
    DenseRank1,
    EnsembleMean,
    EnsembleTile,
    ensemble_size,
    members_as_samples,
)
from tfbnn.layers.spectral import SpectralConv2D, SpectralDense, SpectralNormalization
from tfbnn.layers.gp import RandomFeatureGaussianProcess
from tfbnn.layers.variational_dropout import (
    Conv1DVariationalDropout,
    Conv2DVariationalDropout,
    DenseVariationalDropout,
)

__all__ = [  # in the order a user reads them (the API page follows it)
    # The layers a model is built from: Bayes by Backprop (the three estimators), dense then convolutional
    "DenseFlipout",
    "DenseReparameterization",
    "DenseLocalReparameterization",
    "Conv2DFlipout",
    "Conv2DReparameterization",
    "Conv1DFlipout",
    "Conv1DReparameterization",
    "Conv3DFlipout",
    "Conv3DReparameterization",
    "Conv1DTransposeFlipout",
    "Conv1DTransposeReparameterization",
    "Conv2DTransposeFlipout",
    "Conv2DTransposeReparameterization",
    "Conv3DTransposeFlipout",
    "Conv3DTransposeReparameterization",
    "EmbeddingReparameterization",
    "LSTMReparameterization",
    "GRUReparameterization",
    "LSTMCellReparameterization",
    "GRUCellReparameterization",
    # MC dropout, variational dropout, Graves' variational layer, TFP-style DenseVariational
    "MCDropout",
    "MCSpatialDropout2D",
    "DenseVariationalDropout",
    "Conv1DVariationalDropout",
    "Conv2DVariationalDropout",
    "GravesDense",
    "DenseVariational",
    # Node-based implicit BNNs (iBNN)
    "NodeDense",
    "NodeConv1D",
    "NodeConv2D",
    "NodeNoise",
    "NodeDenseFlow",
    "NodeConv2DFlow",
    # Ensembles in one network, single-pass uncertainty (SNGP)
    "DenseBatchEnsemble",
    "Conv2DBatchEnsemble",
    "DenseRank1",
    "Conv2DRank1",
    "EnsembleTile",
    "EnsembleMean",
    "ensemble_size",
    "members_as_samples",
    "SpectralDense",
    "SpectralConv2D",
    "SpectralNormalization",
    "RandomFeatureGaussianProcess",
    # Output heads (distributions over the targets)
    "GaussianHead",
    "StudentTHead",
    "MixtureNormalHead",
    "BernoulliHead",
    "CategoricalHead",
    "DistributionLambdaHead",
    "HeteroscedasticSoftmax",
    # The bases and argument families a new layer builds on
    "StochasticLayer",
    "BayesianLayer",
    "MeanFieldGaussian",
    "MeanFieldFlipout",
    "DenseArguments",
    "ConvArguments",
    "ConvTransposeArguments",
    # How the convolutions take their input gradient (opt-in: a forward convolution at stride 1)
    "set_conv_input_gradient",
    "conv_input_gradient",
]
