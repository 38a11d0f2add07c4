"""tfbnn layers: Keras 3 layers with distributions over their weights."""

from tfbnn.layers.base import BayesianLayer, StochasticLayer
from tfbnn.likelihoods import GaussianHead
from tfbnn.layers.mc_dropout import MCDropout, MCSpatialDropout2D
from tfbnn.layers.conv import (
    Conv1DFlipout,
    Conv1DReparameterization,
    Conv2DFlipout,
    Conv2DReparameterization,
)
from tfbnn.layers.dense import DenseFlipout, DenseLocalReparameterization, DenseReparameterization
from tfbnn.layers.graves import GravesDense
from tfbnn.layers.node import NodeConv1D, NodeConv2D, NodeDense, NodeNoise
from tfbnn.layers.variational import DenseVariational
from tfbnn.layers.variational_dropout import (
    Conv1DVariationalDropout,
    Conv2DVariationalDropout,
    DenseVariationalDropout,
)

__all__ = [
    "StochasticLayer",
    "BayesianLayer",
    "GaussianHead",
    "MCDropout",
    "MCSpatialDropout2D",
    "DenseReparameterization",
    "DenseFlipout",
    "DenseLocalReparameterization",
    "Conv1DReparameterization",
    "Conv1DFlipout",
    "Conv2DReparameterization",
    "Conv2DFlipout",
    "GravesDense",
    "NodeDense",
    "NodeConv1D",
    "NodeConv2D",
    "NodeNoise",
    "DenseVariationalDropout",
    "Conv1DVariationalDropout",
    "Conv2DVariationalDropout",
    "DenseVariational",
]
