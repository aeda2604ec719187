"""What the training loop needs of data: two datasets, each with a length and batch indexing.

Every source (MNIST, the user's npz arrays, image folders, synthetic data, a Python recipe's
own objects) becomes a `Splits`; the loop splits indices among the ranks and asks a dataset for
`dataset[indices]`, so the equal step counts and the exactly-once evaluation hold whatever
the source.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from hvd_train.errors import UsageError

Labels = Any  # an array (N, ...), or a tuple of them for several targets
Inputs = Any  # an array (N, ...), or a dict of named inputs
MASK = "{}_mask"  # a padded sequence input's mask: True at the positions the sequence has


class Dataset(Protocol):
    """Examples by index: `len(dataset)`, and `dataset[indices]` -> `(x, y)` for an integer
    array of indices, with x's first axis and y's (an array of labels (N, ...) of any dtype,
    or a tuple of them) of that length. x may be a dict of named inputs, each an array (N, ...)
    or a sequence input: a list of N arrays (length, ...) of different lengths (`take` pads
    them)."""

    def __len__(self) -> int: ...

    def __getitem__(self, indices: np.ndarray) -> tuple[Any, Any]: ...


@dataclass(frozen=True)
class ArrayDataset:
    """In-memory arrays: inputs (N, ...), or a dict of named ones (arrays, or lists of N
    arrays of different lengths), and labels (N, ...), or a tuple of label arrays."""

    x: Inputs
    y: Labels

    def __len__(self) -> int:
        return batch_size(self.x)

    def __getitem__(self, indices: np.ndarray) -> tuple[Inputs, Labels]:
        if isinstance(self.x, dict):
            x: Inputs = {name: _rows(value, indices) for name, value in self.x.items()}
        else:
            x = self.x[indices]
        if isinstance(self.y, tuple):
            return x, tuple(labels[indices] for labels in self.y)
        return x, self.y[indices]


def _rows(value: Any, indices: np.ndarray) -> Any:
    return [value[int(index)] for index in indices] if isinstance(value, list) else value[indices]


def on_disk(array: Any) -> bool:
    """Whether `array` is a memory-mapped file's (or a view of one)."""
    return isinstance(array, np.memmap) or isinstance(getattr(array, "base", None), np.memmap)


def batch_size(x: Inputs) -> int:
    """How many examples the inputs `x` (an array, or a dict of named ones) hold."""
    return len(next(iter(x.values()))) if isinstance(x, dict) else len(x)


class SourceTable(Protocol):
    """What a source reads of the `[data]` table that names it (the recipe's `Data`, checked
    against `sources.SOURCES` when made): the keys of `sources.SOURCE_KEYS`, and `fail`, which
    makes the one-line error naming a key."""

    @property
    def dataset(self) -> str: ...

    @property
    def input_shape(self) -> tuple[int, int, int] | None: ...

    @property
    def num_classes(self) -> int | None: ...

    @property
    def path(self) -> str | None: ...

    @property
    def train_samples(self) -> int | None: ...

    @property
    def test_samples(self) -> int | None: ...

    @property
    def resize(self) -> bool | None: ...

    @property
    def input(self) -> str | None: ...

    @property
    def label(self) -> str | None: ...

    def fail(self, key: str, problem: str) -> UsageError: ...


@dataclass(frozen=True)
class Splits:
    train: Dataset
    test: Dataset
    validation: Dataset | None = None  # the source's own, or set aside from the training examples


@dataclass(frozen=True)
class Subset:
    """Some of a dataset's examples, by their indices in it."""

    dataset: Dataset
    indices: np.ndarray

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, indices: np.ndarray) -> tuple[Any, Any]:
        return self.dataset[self.indices[indices]]


def subset(dataset: Dataset, indices: np.ndarray) -> Dataset:
    """The examples `indices` of `dataset`: copied where it is arrays in memory (so that it
    stays arrays in memory, read in the step), else a view that reads them where they are."""
    if isinstance(dataset, ArrayDataset) and not on_disk(dataset.x):
        return ArrayDataset(*dataset[indices])
    return Subset(dataset, indices)


def take(dataset: Dataset, indices: np.ndarray) -> tuple[Inputs, Labels]:
    """One batch as the backends take it, in NumPy: x with floats as float32, a dict's sequence
    inputs padded with zeros to the batch's longest, each with its mask beside it ("tokens":
    (N, longest, ...) and "tokens_mask": (N, longest) booleans); labels as int64 (integers) or
    float32 (floats and booleans), a tuple of them kept a tuple."""
    x, y = dataset[indices]
    x = _named_inputs(x) if isinstance(x, dict) else _as_model_dtype(x)
    if isinstance(y, tuple | list):
        return x, tuple(_as_label_dtype(labels) for labels in y)
    return x, _as_label_dtype(y)


def _named_inputs(x: dict[str, Any]) -> dict[str, np.ndarray]:
    inputs = {}
    for name, value in x.items():
        if isinstance(value, list | tuple) or (
            isinstance(value, np.ndarray) and value.dtype.kind == "O"
        ):
            inputs[name], inputs[MASK.format(name)] = padded(value, name)
        else:
            inputs[name] = _as_model_dtype(value)
    return inputs


def padded(sequences: Any, name: str) -> tuple[np.ndarray, np.ndarray]:
    """Sequences of different lengths (arrays (length, ...) alike after the first axis) as one
    array (N, longest, ...) padded with zeros, and the mask of the positions they hold."""
    arrays = [np.asarray(sequence) for sequence in sequences]
    shapes = {array.shape[1:] for array in arrays}
    if any(array.ndim == 0 for array in arrays) or len(shapes) > 1:
        raise UsageError(
            f"the input {name!r} is a list of {len(arrays)} arrays, which must be sequences "
            "(length, ...) alike after their first axis, to be padded to the longest; give "
            "an array (N, ...) for inputs of one shape"
        )
    lengths = np.array([len(array) for array in arrays])
    dtype = np.result_type(*arrays) if arrays else np.float32
    out = np.zeros((len(arrays), max(lengths, default=0), *shapes.pop()), dtype)
    for row, array in enumerate(arrays):
        out[row, : len(array)] = array
    mask = np.arange(out.shape[1]) < lengths[:, np.newaxis]
    return _as_model_dtype(out), mask


def _as_model_dtype(x: Any) -> np.ndarray:
    x = np.asarray(x)
    return x.astype(np.float32) if x.dtype.kind == "f" and x.dtype != np.float32 else x


def _as_label_dtype(labels: Any) -> np.ndarray:
    labels = np.asarray(labels)
    dtype = np.int64 if labels.dtype.kind in "iu" else np.float32
    return labels.astype(dtype, copy=False)


def located(files: Sequence[Path], starts: np.ndarray, index: int, unit: str) -> str:
    """Where example `index` lies among `files` whose first examples are `starts`, for
    messages: "FILE row R (example INDEX)", `unit` naming what R counts."""
    file = int(np.searchsorted(starts, index, side="right")) - 1
    return f"{files[file]} {unit} {index - starts[file]} (example {index})"


def cache_root() -> Path:
    """Where hvd_train keeps what it fetches or converts: $HVD_TRAIN_CACHE, else
    $XDG_CACHE_HOME/hvd_train, else ~/.cache/hvd_train."""
    root = os.environ.get("HVD_TRAIN_CACHE")
    return Path(root) if root else Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache",
                                        "hvd_train")  # fmt: skip
