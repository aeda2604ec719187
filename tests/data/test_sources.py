"""Synthetic data and a Python recipe's own data, behind the same Dataset interface."""

import numpy as np
import pytest

from hvd_train.data import take
from hvd_train.data.synthetic import load_synthetic
from hvd_train.errors import UsageError
from hvd_train.recipe import Data, Recipe, load_data


def test_synthetic_data_is_the_same_for_any_batching_and_learnable():
    splits = load_synthetic(Data("synthetic", train_samples=500, test_samples=100))
    assert len(splits.train) == 500 and len(splits.test) == 100
    whole_x, whole_y = splits.train[np.arange(500)]
    part_x, part_y = splits.train[np.array([7, 3, 499])]
    assert whole_x.shape == (500, 28, 28, 1) and whole_x.dtype == np.float32
    assert np.array_equal(part_x, whole_x[[7, 3, 499]]) and np.array_equal(
        part_y, whole_y[[7, 3, 499]]
    )
    assert sorted(np.unique(whole_y)) == list(range(10))
    test_x, _ = splits.test[np.arange(100)]
    assert not np.isin(test_x[:, 0, 0, 0], whole_x[:, 0, 0, 0]).any()  # other examples
    # The nearest class prototype names the label: the data allows ~100% accuracy.
    prototypes = splits.train.prototypes.reshape(10, -1)
    distances = ((whole_x.reshape(500, 1, -1) - prototypes) ** 2).sum(axis=2)
    assert (distances.argmin(axis=1) == whole_y).mean() > 0.99


def recipe_with(data) -> Recipe:
    return Recipe(data=data, torch_model=lambda: None, source="mine.py:recipe")


def test_a_python_recipes_arrays_and_objects_become_datasets():
    class Squares:
        def __len__(self):
            return 5

        def __getitem__(self, indices):
            return np.asarray(indices, np.float64) ** 2, np.asarray(indices) % 2

    x = np.arange(12, dtype=np.float64).reshape(6, 2)
    splits = load_data(recipe_with(lambda: ((x, np.arange(6) % 3), Squares())), None)
    batch_x, batch_y = take(splits.train, np.array([1, 4]))
    assert batch_x.dtype == np.float32 and np.array_equal(batch_x, x[[1, 4]])
    assert batch_y.dtype == np.int64 and batch_y.tolist() == [1, 1]
    assert take(splits.test, np.array([3]))[0].tolist() == [9.0] and len(splits.test) == 5


@pytest.mark.parametrize(
    ("returned", "message"),
    [
        (None, "data() returned NoneType; return ((x_train, y_train), (x_test, y_test))"),
        ((1, 2, 3, 4), "data() returned tuple"),
        ({"train": 1, "val": 2, "test": 3}, "data() returned a dict of 'train', 'val', 'test'; "
         "return ((x_train, y_train), (x_test, y_test)), or (train, validation, test), or a dict"),
        (((np.zeros((3, 2)), np.zeros(3, int)), 5, (np.zeros((1, 2)), np.zeros(1, int))),
         "data()'s validation part is int"),
        (((np.zeros((3, 2)), np.zeros(2, int)), (np.zeros((1, 2)), np.zeros(1, int))),
         "data()'s train part has 3 inputs and 2 labels"),
        (((np.zeros((3, 2)), np.zeros(3)), (np.zeros((1, 2)), np.zeros(1, int))),
         "data()'s train labels are float64, and cross_entropy needs one integer class label "
         "per example (or per position); give integer labels, or a loss function"),
        (((np.zeros((3, 2)), (np.zeros(3, int), np.zeros(3))), (np.zeros((1, 2)), np.zeros(1))),
         "data()'s train labels are several targets, and cross_entropy needs one integer"),
        (((np.zeros((3, 2)), np.array(["a", "b", "c"])), (np.zeros((1, 2)), np.zeros(1, int))),
         "data()'s train labels are <U1 [3]; give numbers"),
        (((np.zeros((3, 2)), np.zeros(3, int)), (np.zeros((1, 2)), np.full(1, np.nan))),
         "data()'s test labels hold NaN or infinite values"),
        (((np.zeros((3, 2)), np.zeros(3, int)), 7), "data()'s test part is int"),
        (((np.zeros((0, 2)), np.zeros(0, int)), (np.zeros((1, 2)), np.zeros(1, int))),
         "data()'s train part is empty"),
        (((np.zeros((3, 2)), np.zeros(3, int)), (np.full((1, 2), np.inf), np.zeros(1, int))),
         "data()'s test inputs hold NaN or infinite values"),
    ],
)  # fmt: skip
def test_a_wrong_return_from_a_python_recipes_data_is_one_line(returned, message):
    with pytest.raises(UsageError) as error:
        load_data(recipe_with(lambda: returned), None)
    assert str(error.value).startswith("mine.py:recipe: ") and message in str(error.value)


def test_a_memory_mapped_array_is_not_read_whole_for_a_nan_check(tmp_path):
    # Scanning it would read the whole file before training; a NaN that reaches the loss stops
    # the run instead. The same values in memory are refused.
    x = np.lib.format.open_memmap(tmp_path / "x.npy", "w+", np.float32, (3, 2))
    x[1, 1] = np.nan
    x.flush()
    mapped = np.load(tmp_path / "x.npy", mmap_mode="r")
    labels = np.zeros(3, int)
    splits = load_data(recipe_with(lambda: ((mapped, labels), (mapped, labels))), None)
    assert len(splits.train) == 3
    with pytest.raises(UsageError, match="train inputs hold NaN or infinite values"):
        load_data(recipe_with(lambda: ((np.array(mapped), labels), (mapped, labels))), None)
