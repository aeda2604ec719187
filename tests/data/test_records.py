"""`dataset = "records"`: ArrayRecord files that `hvd-train write-records` writes from any
recipe's data, read back by index exactly as the source gave them; a damaged file or record is
one line naming it."""

import subprocess
import sys

import numpy as np
import pytest

from hvd_train.data import ArrayDataset, Splits, take
from hvd_train.errors import UsageError
from hvd_train.recipe import Data, Recipe, load_data, load_recipe

LIMIT = 100


@pytest.fixture(scope="module")
def npz_recipe(mnist_dir, tmp_path_factory):
    """The first 100 and 50 MNIST images as an npz recipe's data."""
    from hvd_train.data.mnist import mnist_arrays

    folder = tmp_path_factory.mktemp("npz")
    arrays = mnist_arrays(mnist_dir)
    np.savez(folder / "mnist.npz", x_train=arrays["train_images"][:LIMIT],
             y_train=arrays["train_labels"][:LIMIT], x_test=arrays["test_images"][:50],
             y_test=arrays["test_labels"][:50])  # fmt: skip
    recipe = folder / "npz.toml"
    recipe.write_text('[data]\ndataset = "npz"\npath = "mnist.npz"\ninput_shape = [28, 28, 1]\n'
                      "num_classes = 10\n[model]\nlayers = [{ type = \"flatten\" }, "
                      '{ type = "dense", units = 10 }, { type = "softmax" }]\n')  # fmt: skip
    return recipe


@pytest.fixture(scope="module")
def record_files(npz_recipe, tmp_path_factory):
    out = tmp_path_factory.mktemp("records") / "files"
    result = subprocess.run([sys.executable, "-m", "hvd_train", "write-records", "--recipe",
                             str(npz_recipe), str(out), "--records-per-file", "40"],
                            capture_output=True, text=True, check=True)  # fmt: skip
    assert result.stdout.strip() == f"wrote 5 record files into {out}"
    return out


def records(path, **settings) -> Recipe:
    data = Data("records", path=str(path), **{"input_shape": (28, 28, 1), "num_classes": 10,
                                               **settings})  # fmt: skip
    return Recipe(data=data, torch_model=lambda: None)


def test_the_record_files_hold_every_example_as_the_source_gave_it(npz_recipe, record_files):
    assert sorted(p.name for p in record_files.iterdir()) == [
        *(f"test-0000{i}-of-00002.array_record" for i in range(2)),
        *(f"train-0000{i}-of-00003.array_record" for i in range(3)),
    ]
    source, written = (
        load_data(load_recipe(str(npz_recipe)), None),
        load_data(records(record_files), None),
    )
    for part in ("train", "test"):
        expected, got = getattr(source, part), getattr(written, part)
        assert len(got) == len(expected)
        order = np.random.default_rng(0).permutation(len(got))
        for a, b in zip(take(expected, order), take(got, order), strict=True):
            assert a.dtype == b.dtype
            np.testing.assert_array_equal(a, b)


def test_a_damaged_file_or_record_is_one_line_naming_it(record_files, tmp_path):
    damaged = tmp_path / "files"
    damaged.mkdir()
    for file in record_files.iterdir():
        (damaged / file.name).write_bytes(file.read_bytes())
    middle = damaged / "train-00001-of-00003.array_record"
    content = bytearray(middle.read_bytes())
    for at in range(10_000, 10_064):  # among the records (the file ends in padding)
        content[at] ^= 0xFF
    middle.write_bytes(bytes(content))
    splits = load_data(records(damaged), None)
    take(splits.train, np.arange(0, 40))
    with pytest.raises(UsageError, match=r"train-00001-of-00003.array_record record \d+ \(example "
                       r"\d+\) is damaged \(.*\); write the record files again"):  # fmt: skip
        take(splits.train, np.arange(40, 80))
    middle.write_bytes(bytes(content[: len(content) // 2]))
    with pytest.raises(UsageError, match=r"train-00001-of-00003.array_record is not a readable "
                       "ArrayRecord file"):  # fmt: skip
        load_data(records(damaged), None)


def test_mistakes_are_one_line_before_training(record_files, tmp_path):
    with pytest.raises(UsageError, match=r"holds inputs of shape \[28, 28, 1\], and data.input_"):
        load_data(records(record_files, input_shape=(28, 28, 3)), None)
    with pytest.raises(UsageError, match=r"^data.path: .*nowhere is not a folder"):
        load_data(records(tmp_path / "nowhere"), None)
    with pytest.raises(UsageError, match=r"holds no train-\*.array_record file; write them"):
        load_data(records(tmp_path), None)
    with pytest.raises(UsageError, match=r"^data.input_shape: missing; records need it"):
        Data("records", path="x", num_classes=10)
    with pytest.raises(UsageError, match=r"^data.resize: only used with dataset = 'folder' or"):
        Data("records", path="x", num_classes=10, input_shape=(28, 28, 1), resize=True)


def test_named_inputs_are_refused_in_one_line(tmp_path):
    from hvd_train.data.records import write_records

    named = ArrayDataset({"tokens": np.ones((4, 3))}, np.zeros(4, np.int64))
    with pytest.raises(UsageError, match="records hold one input array and one label array"):
        write_records(Splits(named, named), tmp_path)
    assert not list(tmp_path.iterdir())  # no half-written file is left
