"""What the training loop needs of data: two datasets, each with a length and batch indexing.

Every source (MNIST, the user's npz arrays, image folders, synthetic data, a Python recipe's
own objects) becomes a `Splits`; the loop shards indices and asks a dataset for
`dataset[indices]`, so the equal-steps sharding and the exactly-once evaluation hold whatever
the source.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

Labels = Any  # an array (N, ...), or a tuple of them for several targets


class Dataset(Protocol):
    """Examples by index: `len(dataset)`, and `dataset[indices]` -> `(x, y)` for an integer
    array of indices, with x's first axis and y's (an array of labels (N, ...) of any dtype,
    or a tuple of them) of that length."""

    def __len__(self) -> int: ...

    def __getitem__(self, indices: np.ndarray) -> tuple[Any, Any]: ...


@dataclass(frozen=True)
class ArrayDataset:
    """In-memory arrays: inputs (N, ...) and labels (N, ...), or a tuple of label arrays."""

    x: np.ndarray
    y: Labels

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, indices: np.ndarray) -> tuple[np.ndarray, Labels]:
        if isinstance(self.y, tuple):
            return self.x[indices], tuple(labels[indices] for labels in self.y)
        return self.x[indices], self.y[indices]


@dataclass(frozen=True)
class Splits:
    train: Dataset
    test: Dataset


def take(dataset: Dataset, indices: np.ndarray) -> tuple[np.ndarray, Labels]:
    """One batch as the adapters take it, in NumPy: x with floats as float32; labels as
    int64 (integers) or float32 (floats and booleans), a tuple of them kept a tuple."""
    x, y = dataset[indices]
    if isinstance(y, tuple | list):
        return _as_model_dtype(x), tuple(_as_label_dtype(labels) for labels in y)
    return _as_model_dtype(x), _as_label_dtype(y)


def _as_model_dtype(x: Any) -> np.ndarray:
    x = np.asarray(x)
    return x.astype(np.float32) if x.dtype.kind == "f" and x.dtype != np.float32 else x


def _as_label_dtype(labels: Any) -> np.ndarray:
    labels = np.asarray(labels)
    dtype = np.int64 if labels.dtype.kind in "iu" else np.float32
    return labels.astype(dtype, copy=False)


def cache_root() -> Path:
    """Where hvd_train keeps what it fetches or converts: $HVD_TRAIN_CACHE, else
    $XDG_CACHE_HOME/hvd_train, else ~/.cache/hvd_train."""
    root = os.environ.get("HVD_TRAIN_CACHE")
    return Path(root) if root else Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache",
                                        "hvd_train")  # fmt: skip
