"""Data behind one interface: every source becomes `Splits` of two `Dataset`s."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from hvd_train.data.base import ArrayDataset, Dataset, Splits, take
from hvd_train.data.mnist import load_mnist
from hvd_train.data.npz import load_npz
from hvd_train.data.synthetic import load_synthetic
from hvd_train.errors import UsageError
from hvd_train.recipe import Recipe
from hvd_train.recipe.settings import Data

RETURNS = (
    "return ((x_train, y_train), (x_test, y_test)), arrays or datasets with len() and [indices]"
)


def load_data(recipe: Recipe, data_dir: Path | None) -> Splits:
    """The recipe's data; `data_dir` is where MNIST is read from (default: the cache)."""
    data = recipe.data
    if not isinstance(data, Data):
        return _from_python(data(), recipe.source)
    if data.dataset == "mnist":
        return load_mnist(data_dir)
    if data.dataset == "npz":
        return load_npz(data)
    return load_synthetic(data)


def _from_python(returned: Any, source: str) -> Splits:
    """What a Python recipe's data function returned, as Splits; a wrong shape is one line."""
    if not (isinstance(returned, tuple | list) and len(returned) == 2):
        raise UsageError(f"{source}: data() returned {type(returned).__name__}; {RETURNS}")
    return Splits(
        *(
            _dataset(part, name, source)
            for part, name in zip(returned, ("train", "test"), strict=True)
        )
    )


def _dataset(part: Any, name: str, source: str) -> Dataset:
    if isinstance(part, tuple | list) and len(part) == 2 and hasattr(part[0], "__array__"):
        x, y = np.asarray(part[0]), np.asarray(part[1])
        if len(x) != len(y) or y.ndim != 1 or y.dtype.kind not in "iu":
            raise UsageError(
                f"{source}: data()'s {name} part has {len(x)} examples and labels of "
                f"{y.dtype} {list(y.shape)}; give one integer label per example"
            )
        if x.dtype.kind in "fc" and not np.isfinite(x).all():
            raise UsageError(f"{source}: data()'s {name} inputs hold NaN or infinite values")
        dataset: Dataset = ArrayDataset(x, y)
    elif hasattr(part, "__len__") and hasattr(part, "__getitem__"):
        dataset = part
    else:
        raise UsageError(f"{source}: data()'s {name} part is {type(part).__name__}; {RETURNS}")
    if len(dataset) == 0:
        raise UsageError(f"{source}: data()'s {name} part is empty")
    return dataset


__all__ = ["ArrayDataset", "Dataset", "Splits", "load_data", "take"]
