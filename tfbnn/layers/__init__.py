"""tfbnn layers: Keras 3 layers with distributions over their weights."""

from tfbnn.layers.base import BayesianLayer, StochasticLayer
from tfbnn.layers.dense import DenseFlipout, DenseLocalReparameterization, DenseReparameterization
from tfbnn.layers.mc_dropout import MCDropout, MCSpatialDropout2D
from tfbnn.likelihoods import GaussianHead

__all__ = [
    "StochasticLayer",
    "BayesianLayer",
    "GaussianHead",
    "MCDropout",
    "MCSpatialDropout2D",
    "DenseReparameterization",
    "DenseFlipout",
    "DenseLocalReparameterization",
]
