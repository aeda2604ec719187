"""The user's own arrays: loaded as Keras's load_data names them, and every mistake in the file
is one line naming the key and the fix."""

import numpy as np
import pytest

from hvd_train.data.npz import load_npz
from hvd_train.errors import UsageError
from hvd_train.recipe import Data


def arrays(n_train: int = 20, n_test: int = 10, shape=(8, 6, 1), classes: int = 3) -> dict:
    rng = np.random.default_rng(0)
    return {
        "x_train": rng.integers(0, 256, (n_train, *shape), dtype=np.uint8),
        "y_train": rng.integers(0, classes, n_train),
        "x_test": rng.integers(0, 256, (n_test, *shape), dtype=np.uint8),
        "y_test": rng.integers(0, classes, n_test).astype(np.uint8),
    }


def load(tmp_path, shape=(8, 6, 1), classes: int = 3, **content):
    path = tmp_path / "data.npz"
    np.savez(path, **content)
    return load_npz(Data("npz", input_shape=shape, num_classes=classes, path=str(path)))


def test_uint8_images_are_scaled_and_labels_become_int64(tmp_path):
    given = arrays()
    splits = load(tmp_path, **given)
    x, y = splits.train[np.arange(20)]
    assert x.dtype == np.float32 and x.shape == (20, 8, 6, 1)
    np.testing.assert_allclose(x, given["x_train"] / 255.0, rtol=1e-6)
    assert y.dtype == np.int64 and np.array_equal(y, given["y_train"])
    assert len(splits.test) == 10


def test_channel_less_images_and_column_labels_are_accepted(tmp_path):
    given = arrays(shape=(8, 6))  # as keras.datasets.mnist.load_data gives them
    given["y_test"] = given["y_test"][:, None]  # as cifar10.load_data gives them
    splits = load(tmp_path, **given)
    assert splits.train[np.arange(2)][0].shape == (2, 8, 6, 1)
    assert splits.test[np.arange(10)][1].shape == (10,)


def test_float_images_are_taken_as_they_are(tmp_path):
    given = arrays()
    given["x_train"] = given["x_train"].astype(np.float64) - 100
    x, _ = load(tmp_path, **given).train[np.arange(3)]
    assert x.dtype == np.float32 and x.min() < 0


def with_change(key, value):
    return lambda given: given | {key: value(given[key])}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda g: {k: v for k, v in g.items() if k != "y_test"},
         "lacks y_test; save the arrays under the names x_train, y_train, x_test, y_test"),
        (with_change("x_train", lambda x: x[..., :5, :]),
         "x_train has images of shape [8, 5, 1], but data.input_shape is [8, 6, 1]"),
        (with_change("x_test", lambda x: x.astype(np.int32)),
         "x_test is int32; store images as uint8 (0-255) or as floats"),
        (with_change("x_train", lambda x: np.where(x > 250, np.nan, x.astype(np.float32))),
         "x_train holds NaN or infinite values; clean the data"),
        (with_change("y_train", lambda y: y[:-1]), "y_train has 19 labels for 20 images"),
        (with_change("y_train", lambda y: y.astype(np.float32)),
         "y_train must be one integer class label per image, got float32"),
        (with_change("y_test", lambda y: y + 1),
         "y_test has labels from 1 to 3, outside 0 to 2; fix the labels or data.num_classes"),
        (with_change("y_train", lambda y: y - 1),
         "y_train has labels from -1 to 1, outside 0 to 2"),
        (with_change("x_test", lambda x: x[:0]), "x_test is empty"),
    ],
)  # fmt: skip
def test_each_mistake_in_the_file_is_one_line(tmp_path, change, message):
    with pytest.raises(UsageError) as error:
        load(tmp_path, **change(arrays()))
    assert message in str(error.value) and "\n" not in str(error.value)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "data.path: {path} does not exist; fix the path"),
        (b"not a zip archive at all", "{path} is not a readable .npz archive"),
        (b"PK\x03\x04 truncated", "{path} is not a readable .npz archive"),
    ],
)
def test_a_missing_or_unreadable_file_is_one_line(tmp_path, content, message):
    path = tmp_path / "data.npz"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(UsageError) as error:
        load_npz(Data("npz", input_shape=(8, 6, 1), num_classes=3, path=str(path)))
    assert message.format(path=path) in str(error.value) and "\n" not in str(error.value)


def test_a_single_npy_array_is_refused(tmp_path):
    path = tmp_path / "data.npz"
    with path.open("wb") as out:
        np.save(out, np.zeros(3))
    with pytest.raises(UsageError, match="single .npy array, not an .npz archive"):
        load_npz(Data("npz", input_shape=(8, 6, 1), num_classes=3, path=str(path)))


def test_pickled_objects_are_refused(tmp_path):
    given = arrays()
    given["y_train"] = np.array([object()] * 20)
    with pytest.raises(UsageError, match="is not a readable .npz archive"):
        load(tmp_path, **given)
