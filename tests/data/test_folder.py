"""`dataset = "folder"`: images in class folders, read when a batch asks, as scripts/
make-image-folder writes MNIST; every mistake in the folders is one line naming the file."""

import shutil
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from hvd_train.data import take
from hvd_train.data.mnist import mnist_arrays
from hvd_train.errors import UsageError
from hvd_train.recipe import Data, Recipe, load_data
from tests.conftest import REPO

LIMIT = 100  # images of each split: every digit is among them


@pytest.fixture(scope="module")
def mnist_folder(mnist_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("mnist-png")
    script = str(REPO / "scripts" / "make-image-folder")
    subprocess.run([sys.executable, script, str(out), "--data-dir", str(mnist_dir),
                    "--limit", str(LIMIT)], check=True, capture_output=True)  # fmt: skip
    return out


def folder(path, **settings) -> Recipe:
    data = Data("folder", path=str(path), **{"input_shape": (28, 28, 1), "num_classes": 10,
                                              **settings})  # fmt: skip
    return Recipe(data=data, torch_model=lambda: None)


def test_the_images_are_mnists_own_pixels_with_their_class_folders_labels(mnist_folder, mnist_dir):
    splits = load_data(folder(mnist_folder), None)
    arrays = mnist_arrays(mnist_dir)
    assert len(splits.train) == len(splits.test) == LIMIT
    x, y = take(splits.train, np.arange(LIMIT))
    # The files sort by class, then by index within it.
    order = sorted(range(LIMIT), key=lambda i: (arrays["train_labels"][i], i))
    assert y.dtype == np.int64 and (y == arrays["train_labels"][order]).all()
    assert x.dtype == np.float32 and x.shape == (LIMIT, 28, 28, 1)
    np.testing.assert_array_equal(x[..., 0], arrays["train_images"][order] / np.float32(255))


def test_resize_makes_every_image_the_input_shape(mnist_folder):
    splits = load_data(folder(mnist_folder, input_shape=(7, 7, 3), resize=True), None)
    x, _ = take(splits.test, np.arange(3))
    assert x.shape == (3, 7, 7, 3) and (x[..., 0] == x[..., 2]).all()  # grey as RGB
    # Shrunk by area: each pixel is the mean of its 4x4 block, rounded to 8 bits.
    full, _ = take(load_data(folder(mnist_folder), None).test, np.arange(3))
    blocks = (full[..., 0] * 255).reshape(3, 7, 4, 7, 4).mean((2, 4))
    np.testing.assert_allclose(x[..., 0] * 255, blocks, atol=0.5 + 1e-4)


def copy_of(mnist_folder, tmp_path):
    shutil.copytree(mnist_folder, tmp_path / "images")
    return tmp_path / "images"


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda f: f.write_bytes(b"not an image"), "is not a readable image"),
        (lambda f: f.write_bytes(f.read_bytes()[:60]), "is not a readable image"),
        (lambda f: f.unlink(), r"cannot be read \(No such file or directory\); replace or remove"),
        (lambda f: Image.new("L", (20, 28)).save(f, format="PNG"),
         "is 20x28, and data.input_shape asks for 28x28; set data.resize = true"),
    ],
)  # fmt: skip
def test_a_bad_image_is_named_with_its_example_when_its_batch_is_read(
    damage, message, mnist_folder, tmp_path
):
    root = copy_of(mnist_folder, tmp_path)
    bad = sorted((root / "train" / "0").iterdir())[0]
    splits = load_data(folder(root), None)  # the files are only listed here
    damage(bad)
    take(splits.train, np.arange(1, LIMIT))
    with pytest.raises(UsageError, match=f"^{bad} \\(example 0\\) {message}") as error:
        take(splits.train, np.arange(LIMIT))
    assert "\n" not in str(error.value)


def test_mistakes_in_the_folders_are_one_line(mnist_folder, tmp_path):
    root = copy_of(mnist_folder, tmp_path)
    with pytest.raises(UsageError, match="has 10 class folders, and data.num_classes is 9"):
        load_data(folder(root, num_classes=9), None)
    with pytest.raises(UsageError, match=r"^data.path: .*nowhere/train is not a folder"):
        load_data(folder(tmp_path / "nowhere"), None)
    for image in (root / "test" / "7").iterdir():
        image.unlink()
    with pytest.raises(UsageError, match=r"test/7 holds no .png or .jpg images"):
        load_data(folder(root), None)
    (root / "test" / "7").rmdir()
    with pytest.raises(UsageError, match=r"test's class folders differ from train/'s \(at '7'\)"):
        load_data(folder(root), None)


def test_folder_settings_are_checked_like_any_other():
    with pytest.raises(UsageError, match=r"^data.input_shape: missing; folder data needs it"):
        Data("folder", path="x", num_classes=10)
    with pytest.raises(UsageError, match=r"^data.input_shape: folder images have 1 channel"):
        Data("folder", path="x", num_classes=10, input_shape=(8, 8, 2))
    with pytest.raises(
        UsageError, match=r"^data.resize: only used with dataset = 'folder' or 'parquet'"
    ):
        Data("mnist", resize=True)
    with pytest.raises(
        UsageError, match=r"^data.path: only used with dataset = 'npz', 'folder', 'parquet' or"
    ):
        Data("mnist", path="x")
