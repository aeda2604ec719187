"""What the training loop needs of data: two datasets, each with a length and batch indexing.

Every source (MNIST, the user's npz arrays, synthetic data, a Python recipe's own objects)
becomes a `Splits`; the loop shards indices and asks a dataset for `dataset[indices]`, so the
equal-steps sharding and the exactly-once evaluation hold whatever the source.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np


class Dataset(Protocol):
    """Examples by index: `len(dataset)`, and `dataset[indices]` -> `(x, y)` for an integer
    array of indices, with x's first axis and y (integer class labels) of that length."""

    def __len__(self) -> int: ...

    def __getitem__(self, indices: np.ndarray) -> tuple[Any, Any]: ...


@dataclass(frozen=True)
class ArrayDataset:
    """In-memory arrays: images (N, ...) and labels (N,)."""

    x: np.ndarray
    y: np.ndarray

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return self.x[indices], self.y[indices]


@dataclass(frozen=True)
class Splits:
    train: Dataset
    test: Dataset


def take(dataset: Dataset, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One batch as the adapters take it: x as NumPy (floats as float32), labels as int64."""
    x, y = dataset[indices]
    x = np.asarray(x)
    if x.dtype.kind == "f" and x.dtype != np.float32:
        x = x.astype(np.float32)
    return x, np.asarray(y).astype(np.int64, copy=False)
