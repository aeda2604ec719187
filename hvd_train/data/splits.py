"""Examples as `Splits`: what a Python recipe's data function returned, checked; the
deterministic transforms on the splits that are evaluated; a validation split set aside from
the training examples. (A recipe's data, as its tables ask: `recipe/examples.py`.)"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from hvd_train.data.base import (
    MASK,
    ArrayDataset,
    Dataset,
    Splits,
    on_disk,
    subset,
)
from hvd_train.data.hugging_face import hugging_face, is_hugging_face
from hvd_train.data.transforms import Transform, Transformed
from hvd_train.errors import UsageError

VALIDATION_STREAM = 7  # the seed's stream for the validation split, apart from the others

RETURNS = (
    "return ((x_train, y_train), (x_test, y_test)), or (train, validation, test), or a dict of "
    "train, test and optionally validation (a Hugging Face DatasetDict); each part arrays or a "
    "dataset with len() and [indices] (Hugging Face's too)"
)
# What a dict from a Python recipe's data function holds: its splits by name (DatasetDict's).
SPLIT_NAMES = ("train", "validation", "test")


def with_evaluation_transforms(splits: Splits, evaluation: tuple[Transform, ...]) -> Splits:
    """`splits` with the deterministic transforms (`evaluation`) applied to its test and
    validation splits (the training split takes them all as its batches are read)."""
    if not evaluation:
        return splits
    validation = splits.validation and Transformed(splits.validation, evaluation)
    return Splits(splits.train, Transformed(splits.test, evaluation), validation)


def set_aside(splits: Splits, held: int, seed: int, evaluation: tuple[Transform, ...]) -> Splits:
    """`splits` with `held` of its training examples set aside as the validation split, drawn
    with `seed` alone (the same on every rank and at any world size), taking the deterministic
    transforms (`evaluation`) as the test split does."""
    order = np.random.default_rng([seed, VALIDATION_STREAM]).permutation(len(splits.train))
    validation = subset(splits.train, np.sort(order[:held]))
    if evaluation:
        validation = Transformed(validation, evaluation)
    return Splits(subset(splits.train, np.sort(order[held:])), splits.test, validation)


def from_function(returned: Any, source: str, loss: Any) -> Splits:
    """What a Python recipe's data function (in file `source`) returned, as Splits, checked for
    what `loss` needs; a wrong shape is one line."""
    if isinstance(returned, Mapping):
        if not {"train", "test"} <= set(returned) <= set(SPLIT_NAMES):
            names = ", ".join(map(repr, returned))
            raise UsageError(f"{source}: data() returned a dict of {names}; {RETURNS}")
        parts = dict(returned)
    elif isinstance(returned, tuple | list) and len(returned) in (2, 3):
        named = SPLIT_NAMES if len(returned) == 3 else ("train", "test")
        parts = dict(zip(named, returned, strict=True))
    else:
        raise UsageError(f"{source}: data() returned {type(returned).__name__}; {RETURNS}")
    made = {name: _dataset(part, f"{source}: data()'s {name}", loss)
            for name, part in parts.items()}  # fmt: skip
    return Splits(made["train"], made["test"], made.get("validation"))


def _dataset(part: Any, what: str, loss: Any) -> Dataset:
    if (
        isinstance(part, tuple | list)
        and len(part) == 2
        and (hasattr(part[0], "__array__") or isinstance(part[0], dict))
    ):
        y = part[1]
        y = tuple(map(np.asarray, y)) if isinstance(y, tuple | list) else np.asarray(y)
        dataset: Dataset = ArrayDataset(_inputs(part[0], what), y)
    elif is_hugging_face(part):
        dataset = hugging_face(part, what)
    elif hasattr(part, "__len__") and hasattr(part, "__getitem__"):
        dataset = part
    else:
        raise UsageError(f"{what} part is {type(part).__name__}; {RETURNS}")
    if len(dataset) == 0:
        raise UsageError(f"{what} part is empty")
    if isinstance(dataset, ArrayDataset):
        check_labels(dataset.y, len(dataset), what, loss)
    else:  # the user's own dataset: a sample of its labels
        check_labels(dataset[np.arange(min(2, len(dataset)))][1], None, what, loss)
    return dataset


def _inputs(x: Any, what: str) -> Any:
    """Inputs held in memory: an array, or a dict of named arrays and sequence inputs (lists
    of arrays of different lengths), all of one length and finite."""
    if not isinstance(x, dict):
        return _finite(np.asarray(x), f"{what} inputs")
    if not x or not all(isinstance(name, str) for name in x):
        raise UsageError(f"{what} inputs are a dict; give it one entry or more, named by strings")
    inputs: dict[str, Any] = {}
    for name, value in x.items():
        if MASK.format(name) in x:
            raise UsageError(f"{what} inputs have both {name!r} and {MASK.format(name)!r}, the "
                             "name a sequence input's mask takes; rename the second")  # fmt: skip
        if isinstance(value, list | tuple):
            inputs[name] = [_finite(np.asarray(s), f"{what} input {name!r}") for s in value]
        else:
            inputs[name] = _finite(np.asarray(value), f"{what} input {name!r}")
    counts = {name: len(value) for name, value in inputs.items()}
    if len(set(counts.values())) > 1:
        shown = ", ".join(f"{name!r} {count}" for name, count in counts.items())
        raise UsageError(f"{what} inputs have different numbers of examples ({shown}); give "
                         "each input one entry per example")  # fmt: skip
    return inputs


def _finite(array: np.ndarray, what: str) -> np.ndarray:
    """`array`, checked for NaN and infinite values, unless it is a file's memory map: that
    would read the file whole (a NaN that reaches the loss stops the run instead)."""
    if array.dtype.kind in "fc" and not on_disk(array) and not np.isfinite(array).all():
        raise UsageError(f"{what} hold NaN or infinite values")
    return array


def check_labels(labels: Any, count: int | None, what: str, loss: Any) -> None:
    """Labels of any shape and numeric dtype, `count` of them (None: a sample), finite, and
    what the loss needs: one array of integer class labels for cross_entropy."""
    for array in labels if isinstance(labels, tuple | list) else (labels,):
        array = np.asarray(array)
        if array.dtype.kind not in "biuf" or array.ndim == 0:
            raise UsageError(
                f"{what} labels are {array.dtype} {list(array.shape)}; give numbers, an array "
                "(N, ...) per target"
            )
        if count is not None and len(array) != count:
            raise UsageError(f"{what} part has {count} inputs and {len(array)} labels")
        if array.dtype.kind == "f" and not np.isfinite(array).all():
            raise UsageError(f"{what} labels hold NaN or infinite values")
    if loss == "cross_entropy" and (
        isinstance(labels, tuple | list) or np.asarray(labels).dtype.kind not in "iu"
    ):
        got = "several targets" if isinstance(labels, tuple | list) else np.asarray(labels).dtype
        raise UsageError(
            f"{what} labels are {got}, and cross_entropy needs one integer class label per "
            "example (or per position); give integer labels, or a loss function (Recipe(loss="
            "...)) for other targets"
        )
