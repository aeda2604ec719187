"""Batches beyond one array: named inputs (a dict) and sequences of different lengths, padded per
batch to the longest with their mask beside them; a Python recipe's own transform sees one
example's inputs by name."""

import numpy as np
import pytest

from hvd_train.data import ArrayDataset, take
from hvd_train.data.transforms import apply
from hvd_train.errors import UsageError
from hvd_train.recipe import Recipe, load_data

TEXTS = [np.arange(1, n + 1, dtype=np.int32) for n in (3, 1, 5, 0, 2)]


def test_sequences_are_padded_to_the_batchs_longest_with_their_mask():
    dataset = ArrayDataset({"tokens": TEXTS, "extra": np.ones((5, 2))}, np.arange(5))
    x, y = take(dataset, np.array([1, 4, 3]))
    assert sorted(x) == ["extra", "tokens", "tokens_mask"] and list(y) == [1, 4, 3]
    np.testing.assert_array_equal(x["tokens"], [[1, 0], [1, 2], [0, 0]])
    np.testing.assert_array_equal(x["tokens_mask"], [[True, False], [True, True], [False, False]])
    assert x["tokens"].dtype == np.int32 and x["extra"].dtype == np.float32
    x, _ = take(dataset, np.array([2, 0]))
    assert x["tokens"].shape == (2, 5) and x["tokens_mask"].sum() == 8


def test_sequences_of_vectors_keep_their_trailing_axes():
    frames = [np.full((n, 3), n, dtype=np.float64) for n in (2, 4)]
    x, _ = take(ArrayDataset({"frames": frames}, np.zeros(2, np.int64)), np.arange(2))
    assert x["frames"].shape == (2, 4, 3) and x["frames"].dtype == np.float32
    assert (x["frames"][0, 2:] == 0).all() and (x["frames"][1] == 4).all()


def python_recipe(x):
    return Recipe(data=lambda: ((x, np.zeros(5, np.int64)), (x, np.zeros(5, np.int64))),
                  torch_model=lambda: None)  # fmt: skip


def test_a_python_recipes_named_inputs_are_held_and_checked():
    splits = load_data(python_recipe({"tokens": TEXTS, "extra": np.ones((5, 2))}), None)
    x, _ = take(splits.train, np.arange(5))
    assert x["tokens"].shape == (5, 5)
    mistakes = [
        ({"tokens": TEXTS, "extra": np.ones((4, 2))},
         r"inputs have different numbers of examples \('tokens' 5, 'extra' 4\)"),
        ({"a": np.ones(5), "a_mask": np.ones(5)}, "inputs have both 'a' and 'a_mask', the name"),
        ({"a": np.array([1.0, np.nan, 0, 0, 0])}, "input 'a' hold NaN or infinite values"),
        ({}, "inputs are a dict; give it one entry or more"),
    ]  # fmt: skip
    for x, message in mistakes:
        with pytest.raises(UsageError, match=message):
            load_data(python_recipe(x), None)


def test_sequences_that_differ_after_their_first_axis_are_one_line():
    dataset = ArrayDataset({"tokens": [np.ones((2, 3)), np.ones((2, 4))]}, np.zeros(2))
    with pytest.raises(UsageError, match=r"^the input 'tokens' is a list of 2 arrays, which must"):
        take(dataset, np.arange(2))


def test_a_transform_takes_one_examples_inputs_by_name_and_keeps_their_dtypes():
    x, _ = take(ArrayDataset({"tokens": TEXTS}, np.zeros(5)), np.array([0, 2]))

    def reverse(example, rng):
        assert sorted(example) == ["tokens", "tokens_mask"] and example["tokens"].ndim == 1
        length = int(example["tokens_mask"].sum())
        example["tokens"][:length] = example["tokens"][:length][::-1].copy()
        return example

    out = apply([reverse], x, np.array([0, 2]), seed=0, epoch=0)
    assert out["tokens"].dtype == np.int32
    np.testing.assert_array_equal(out["tokens"], [[3, 2, 1, 0, 0], [5, 4, 3, 2, 1]])
