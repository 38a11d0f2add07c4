"""tfbnn layers: Keras 3 layers with distributions over their weights."""

from tfbnn.layers.base import BayesianLayer
from tfbnn.layers.dense import DenseFlipout, DenseLocalReparameterization, DenseReparameterization

__all__ = [
    "BayesianLayer",
    "DenseReparameterization",
    "DenseFlipout",
    "DenseLocalReparameterization",
]
