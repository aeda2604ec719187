"""A recipe's examples as `Splits`: its source's (or its own data function's, checked), with the
transforms and the validation split its tables ask for."""

from __future__ import annotations

from pathlib import Path

from hvd_train.data import Splits, from_function, set_aside, with_evaluation_transforms
from hvd_train.data.sources import load_from_source
from hvd_train.errors import UsageError
from hvd_train.recipe.base import Recipe


def load_data(recipe: Recipe, data_dir: Path | None) -> Splits:
    """The recipe's data; `data_dir` is where MNIST is read from (default: the cache). The test
    split takes the deterministic transforms (the training split takes them all as its batches
    are read: `data/pipeline.py`)."""
    return with_evaluation_transforms(load_source(recipe, data_dir), recipe.transforms().evaluation)


def load_source(recipe: Recipe, data_dir: Path | None) -> Splits:
    """The recipe's data as its source (or its own data function) gives it, without
    transforms."""
    data = recipe.data
    if callable(data):
        return from_function(data(), recipe.source, recipe.loss)
    return load_from_source(data, data_dir)


def with_validation(splits: Splits, recipe: Recipe, seed: int) -> Splits:
    """`splits` with the recipe's `validation_fraction` of the training examples set aside as
    the validation split: drawn with `seed` alone, so the same on every rank and at any world
    size, and taking evaluation's transforms as the test split does. A source's own
    validation split stays as it is."""
    fraction, count = recipe.loading.validation_fraction, len(splits.train)
    if splits.validation is not None and fraction:
        raise UsageError(
            f"data.validation_fraction: the data gives its own validation split "
            f"({len(splits.validation)} examples); remove validation_fraction"
        )
    if not fraction:
        if splits.validation is None and (watcher := recipe.validation_watcher()):
            raise UsageError(
                f"{watcher}: it watches the validation split, which {recipe.source or 'the data'}"
                "'s data function does not return; return (train, validation, test), or set "
                "data.validation_fraction (0.1 is usual)"
            )
        return splits
    held = round(count * fraction)
    if not 0 < held < count:
        raise UsageError(
            f"data.validation_fraction: {fraction} of the {count} training examples sets aside "
            f"{held}; give a fraction that leaves examples on both sides"
        )
    return set_aside(splits, held, seed, recipe.transforms().evaluation)
