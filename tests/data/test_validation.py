"""The validation split: set aside from the training examples with the seed alone (so the same
on every rank and at any world size), disjoint from what trains, read through the same source."""

import dataclasses

import numpy as np
import pytest

from hvd_train.data import ArrayDataset, Splits, take
from hvd_train.data.base import Subset
from hvd_train.errors import UsageError
from hvd_train.recipe import Checkpoints, Data, Loading, Recipe, load_data, with_validation


def splits(train: object) -> Splits:
    return Splits(train, ArrayDataset(np.zeros((4, 1)), np.zeros(4)))  # type: ignore[arg-type]


def recipe(fraction: float) -> Recipe:
    return Recipe(data=Data("synthetic"), torch_model=lambda: None,
                  loading=Loading(validation_fraction=fraction))  # fmt: skip


class Files:
    """A source that reads its examples where they are (not arrays in memory)."""

    def __init__(self, count: int) -> None:
        self.count = count

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return np.asarray(indices, np.float32)[:, None], np.asarray(indices)


def test_the_split_is_the_seeds_disjoint_and_whole():
    train = ArrayDataset(np.arange(100, dtype=np.float32)[:, None], np.arange(100))
    given = splits(train)
    first = with_validation(given, recipe(0.1), seed=42)
    again = with_validation(splits(train), recipe(0.1), seed=42)
    other = with_validation(splits(train), recipe(0.1), seed=7)
    held = set(first.validation[np.arange(10)][1])  # type: ignore[index]
    kept = set(first.train[np.arange(90)][1])
    assert len(held) == 10 and len(kept) == 90 and held | kept == set(range(100))
    assert held == set(again.validation[np.arange(10)][1])  # type: ignore[index]
    assert held != set(other.validation[np.arange(10)][1])  # type: ignore[index]
    assert held != set(range(10))  # drawn, not the first ones
    # Arrays in memory stay arrays in memory (read in the step); the test set is untouched.
    assert isinstance(first.train, ArrayDataset) and first.test is given.test


def test_a_source_on_disk_is_read_through_a_view():
    split = with_validation(splits(Files(50)), recipe(0.2), seed=1)
    assert isinstance(split.train, Subset) and len(split.train) == 40
    x, y = split.validation[np.arange(10)]  # type: ignore[index]
    assert np.array_equal(x[:, 0], y) and len(set(y)) == 10


def test_no_fraction_is_no_split_and_one_that_leaves_nothing_is_one_line():
    assert with_validation(splits(Files(50)), recipe(0.0), seed=1).validation is None
    with pytest.raises(UsageError, match=r"data.validation_fraction: 0.001 of the 50 training "
                       r"examples sets aside 0; give a fraction that leaves examples on both "
                       r"sides"):  # fmt: skip
        with_validation(splits(Files(50)), recipe(0.001), seed=1)


def part(first: int, count: int) -> tuple[np.ndarray, np.ndarray]:
    return np.arange(first, first + count, dtype=np.float32)[:, None], np.arange(count) % 2


@pytest.mark.parametrize("as_dict", [False, True])
def test_a_sources_own_validation_split_is_taken_as_it_is(as_dict):
    train, validation, test = part(0, 20), part(100, 6), part(200, 4)
    returned = ({"test": test, "validation": validation, "train": train} if as_dict
                else (train, validation, test))  # fmt: skip
    given = Recipe(data=lambda: returned, torch_model=lambda: None,
                   checkpoints=Checkpoints(keep_best=1))  # fmt: skip
    split = with_validation(load_data(given, None), given, seed=1)
    assert split.validation is not None and len(split.train) == 20 and len(split.test) == 4
    assert take(split.validation, np.arange(6))[0][:, 0].tolist() == list(range(100, 106))
    also = dataclasses.replace(given, loading=Loading(validation_fraction=0.1))
    own = (r"^data.validation_fraction: the data gives its own validation split \(6 examples\); "
           r"remove validation_fraction$")  # fmt: skip
    with pytest.raises(UsageError, match=own):
        with_validation(load_data(given, None), also, seed=1)


def test_watching_a_validation_split_that_a_data_function_does_not_return_is_one_line():
    given = Recipe(data=lambda: (part(0, 20), part(200, 4)), torch_model=lambda: None,
                   checkpoints=Checkpoints(keep_best=1), source="mine.py")  # fmt: skip
    message = (r"^checkpoints.keep_best: it watches the validation split, which mine.py's data "
               r"function does not return; return \(train, validation, test\), or set "
               r"data.validation_fraction \(0.1 is usual\)$")  # fmt: skip
    with pytest.raises(UsageError, match=message):
        with_validation(load_data(given, None), given, seed=1)
