"""The in-memory dataset type every tfbnn loader returns."""

import dataclasses

import numpy as np

__all__ = ["ArrayDataset"]


@dataclasses.dataclass(frozen=True, repr=False)
class ArrayDataset:
    """A train/test split held as NumPy arrays.

    Attributes:
        x_train: float32 array ``(N, ...)``, the training inputs.
        y_train: int32 array ``(N,)``, integer class labels in ``[0, num_classes)``.
        x_test: float32 array ``(N_test, ...)``.
        y_test: int32 array ``(N_test,)``.
        num_classes: int, the number of classes.
        name: str, the dataset's name (``"digits"``, ``"mnist"``, ...).

    ``num_examples`` is ``N = len(x_train)``, the number of training examples
    actually loaded: the ``N`` of the ELBO convention
    (``tfbnn.KLAnnealing(num_examples=ds.num_examples)``).

    Example:
        >>> import tfbnn
        >>> ds = tfbnn.datasets.load("digits")
        >>> ds.num_examples, ds.x_train.shape[1:], ds.num_classes
        (1437, (64,), 10)
    """

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    num_classes: int
    name: str

    def __post_init__(self):
        if len(self.x_train) != len(self.y_train):
            raise ValueError(
                "Expected as many training labels as training inputs. Received: "
                f"len(x_train)={len(self.x_train)}, len(y_train)={len(self.y_train)}"
            )
        if len(self.x_test) != len(self.y_test):
            raise ValueError(
                "Expected as many test labels as test inputs. Received: "
                f"len(x_test)={len(self.x_test)}, len(y_test)={len(self.y_test)}"
            )

    @property
    def num_examples(self):
        """``N``, the number of training examples."""
        return int(len(self.x_train))

    @property
    def num_test_examples(self):
        """The number of test examples."""
        return int(len(self.x_test))

    @property
    def input_shape(self):
        """The shape of one input, e.g. ``(64,)``."""
        return tuple(self.x_train.shape[1:])

    def __repr__(self):
        return (
            f"ArrayDataset(name={self.name!r}, x_train={self.x_train.shape} {self.x_train.dtype}, "
            f"y_train={self.y_train.shape} {self.y_train.dtype}, x_test={self.x_test.shape}, "
            f"y_test={self.y_test.shape}, num_classes={self.num_classes})"
        )
