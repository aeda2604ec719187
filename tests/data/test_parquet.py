"""`dataset = "parquet"`: images in Parquet tables (encoded, as scripts/make-parquet and
Hugging Face write them, or as pixels), read from a memory-mapped Arrow copy made once; every
mistake in a table is one line naming the file (and the row)."""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from hvd_train.data import take
from hvd_train.data.mnist import mnist_arrays
from hvd_train.errors import UsageError
from hvd_train.recipe import Data, Recipe, load_data
from tests.conftest import REPO

LIMIT = 100  # images of each split: every digit is among them


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HVD_TRAIN_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache" / "arrow"


@pytest.fixture(scope="module")
def mnist_parquet(mnist_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("mnist-parquet")
    script = str(REPO / "scripts" / "make-parquet")
    subprocess.run([sys.executable, script, str(out), "--data-dir", str(mnist_dir),
                    "--limit", str(LIMIT)], check=True, capture_output=True)  # fmt: skip
    return out


def parquet(path, **settings) -> Recipe:
    data = Data("parquet", path=str(path), **{"input_shape": (28, 28, 1), "num_classes": 10,
                                               **settings})  # fmt: skip
    return Recipe(data=data, torch_model=lambda: None)


def test_encoded_images_are_mnists_own_pixels_and_labels(mnist_parquet, mnist_dir):
    splits = load_data(parquet(mnist_parquet), None)
    arrays = mnist_arrays(mnist_dir)
    assert len(splits.train) == len(splits.test) == LIMIT
    order = np.random.default_rng(0).permutation(LIMIT)
    x, y = take(splits.test, order)
    assert y.dtype == np.int64 and (y == arrays["test_labels"][order]).all()
    assert x.dtype == np.float32 and x.shape == (LIMIT, 28, 28, 1)
    np.testing.assert_array_equal(x[..., 0], arrays["test_images"][order] / np.float32(255))


def write_pixels(folder, images, labels, kind, files=2):
    """`images` as lists of numbers of type `kind`, nested per row, in `files` train files and
    one test file."""
    folder.mkdir()
    rows = pa.array([np.asarray(image).tolist() for image in images], kind)
    for part, chunk in enumerate(np.array_split(np.arange(len(images)), files)):
        table = pa.table({"label": labels[chunk], "pixels": rows.take(chunk)})
        pq.write_table(table, folder / f"train-{part:05d}-of-{files:05d}.parquet", row_group_size=7)
    (folder / "test").mkdir()
    pq.write_table(pa.table({"label": labels, "pixels": rows}), folder / "test" / "part-0.parquet")
    return folder


@pytest.mark.parametrize(
    ("kind", "flat"),
    [(pa.list_(pa.list_(pa.uint8())), False), (pa.list_(pa.float32()), True),
     (pa.list_(pa.float64(), 784), True)],
)  # fmt: skip
def test_pixels_in_lists_of_any_depth_across_files_read_in_order(kind, flat, mnist_dir, tmp_path):
    arrays = mnist_arrays(mnist_dir)
    images = arrays["train_images"][:LIMIT]
    leaf = kind
    while hasattr(leaf, "value_type"):
        leaf = leaf.value_type
    if pa.types.is_floating(leaf):  # floats are taken as they are; uint8 is scaled
        images = images / np.float32(255)
    if flat:
        images = images.reshape(LIMIT, -1)
    root = write_pixels(tmp_path / "pixels", images, arrays["train_labels"][:LIMIT], kind)
    splits = load_data(parquet(root, input="pixels"), None)
    indices = np.array([99, 0, 49, 50, 13])  # across the two files and their row groups
    x, y = take(splits.train, indices)
    expected = arrays["train_images"][indices] / np.float32(255)
    np.testing.assert_allclose(x[..., 0], expected, rtol=1e-6)
    assert (y == arrays["train_labels"][indices]).all()
    assert len(splits.test) == LIMIT


def test_the_arrow_copy_is_made_once_memory_mapped_and_again_when_the_file_changes(
    mnist_parquet, tmp_path, cache
):
    root = tmp_path / "tables"
    root.mkdir()
    for name in ("train.parquet", "test.parquet"):
        (root / name).write_bytes((mnist_parquet / name).read_bytes())
    splits = load_data(parquet(root), None)
    copies = sorted(cache.glob("*.arrow"))
    assert len(copies) == 2
    # The columns are the mapped files' pages, not memory of this process.
    mapped = [mapping.split()[0].split("-") for mapping in Path("/proc/self/maps").read_text()
              .splitlines() if mapping.endswith(str(copies[1]))]  # fmt: skip
    start, end = int(mapped[0][0], 16), int(mapped[0][1], 16)
    for column in splits.train.table.columns:
        for buffer in column.chunks[0].buffers():
            assert buffer is None or not buffer.size or start <= buffer.address < end
    written = {copy: copy.stat().st_mtime_ns for copy in copies}
    load_data(parquet(root), None)
    assert {copy: copy.stat().st_mtime_ns for copy in cache.glob("*.arrow")} == written
    os.utime(root / "test.parquet", ns=(1, 1))
    load_data(parquet(root), None)
    assert len(list(cache.glob("*.arrow"))) == 3
    assert len(splits.train) == LIMIT


def broken_tables(mnist_parquet, tmp_path, change):
    root = tmp_path / "tables"
    root.mkdir()
    table = pq.read_table(mnist_parquet / "train.parquet")
    pq.write_table(table, root / "train.parquet")
    pq.write_table(change(table), root / "test.parquet")
    return root


def with_image(table, row, encoded):
    images = table.column("image").to_pylist()
    images[row] = {"bytes": encoded, "path": None}
    return table.set_column(0, "image", pa.array(images, table.schema.field("image").type))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda t: with_image(t, 5, b"not a png"), r"row 5 \(example 5\) is not a readable image"),
        (lambda t: with_image(t, 7, with_image.png[:50]),
         r"row 7 \(example 7\) is not a readable image"),
        (lambda t: with_image(t, 3, with_image.small),
         r"row 3 \(example 3\) is 20x28, and data.input_shape asks for 28x28"),
    ],
)  # fmt: skip
def test_a_bad_image_is_named_with_its_row_when_its_batch_is_read(
    change, message, mnist_parquet, tmp_path
):
    import io

    from PIL import Image

    table = pq.read_table(mnist_parquet / "train.parquet")
    with_image.png = table.column("image")[0].as_py()["bytes"]
    small = io.BytesIO()
    Image.new("L", (20, 28)).save(small, format="PNG")
    with_image.small = small.getvalue()
    root = broken_tables(mnist_parquet, tmp_path, change)
    splits = load_data(parquet(root), None)
    take(splits.test, np.arange(8, LIMIT))
    with pytest.raises(UsageError, match=f"^{root / 'test.parquet'} {message}") as error:
        take(splits.test, np.arange(LIMIT))
    assert "\n" not in str(error.value)


def test_pixels_of_another_size_name_their_row(mnist_dir, tmp_path):
    arrays = mnist_arrays(mnist_dir)
    images = [image.ravel().tolist() for image in arrays["train_images"][:10]]
    images[4] = images[4][:700]
    root = write_pixels(tmp_path / "pixels", np.array(images, dtype=object),
                        arrays["train_labels"][:10], pa.list_(pa.uint8()), files=1)  # fmt: skip
    splits = load_data(parquet(root, input="pixels"), None)
    with pytest.raises(UsageError, match=r"row 4 \(example 4\) holds 700 numbers, and data.input_"
                       r"shape \[28, 28, 1\] needs 784; give every image that shape"):  # fmt: skip
        take(splits.train, np.arange(10))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda t: t.rename_columns(["picture", "label"]),
         "test.parquet has no column 'image' \\(it has 'picture', 'label'\\); name the columns"),
        (lambda t: t.set_column(1, "label", pa.array([str(v) for v in t.column(1).to_pylist()])),
         "test.parquet: column 'label' is string; it must hold integer class labels"),
        (lambda t: t.set_column(0, "image", pa.array(range(t.num_rows))),
         "test.parquet: column 'image' is int64; it must hold encoded images"),
        (lambda t: t.set_column(1, "label", pa.array([*t.column(1).to_pylist()[:-1], 10])),
         "test.parquet: column 'label' has labels from 0 to 10, outside 0 to 9; fix the labels"),
        (lambda t: t.set_column(1, "label", pa.array([*t.column(1).to_pylist()[:-2], None, 1])),
         "test.parquet row 98: 'label' is empty; fill or remove that row"),
        (lambda t: t.slice(0, 0), "the test\\*.parquet files of .* hold no rows"),
    ],
)  # fmt: skip
def test_mistakes_in_a_table_are_one_line_before_training(change, message, mnist_parquet,
                                                          tmp_path):  # fmt: skip
    root = broken_tables(mnist_parquet, tmp_path, change)
    with pytest.raises(UsageError, match=message) as error:
        load_data(parquet(root), None)
    assert "\n" not in str(error.value)


def test_unreadable_files_missing_splits_and_a_full_cache_are_one_line(
    mnist_parquet, tmp_path, monkeypatch
):
    root = tmp_path / "tables"
    root.mkdir()
    (root / "train.parquet").write_bytes((mnist_parquet / "train.parquet").read_bytes())
    with pytest.raises(UsageError, match=r"tables holds no test\*.parquet file and no test/ "):
        load_data(parquet(root), None)
    (root / "test.parquet").write_bytes((mnist_parquet / "test.parquet").read_bytes()[:-200])
    with pytest.raises(UsageError, match=r"test.parquet is not a readable Parquet file \(.*\); "
                       "write it again"):  # fmt: skip
        load_data(parquet(root), None)
    with pytest.raises(UsageError, match=r"^data.path: .*nowhere is not a folder"):
        load_data(parquet(tmp_path / "nowhere"), None)
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("HVD_TRAIN_CACHE", str(tmp_path / "file" / "cache"))
    with pytest.raises(UsageError, match=r"cannot write the Arrow copy of .*train.parquet in .*; "
                       "free some space there or set HVD_TRAIN_CACHE"):  # fmt: skip
        load_data(parquet(root), None)


def test_parquet_settings_are_checked_like_any_other():
    data = Data("parquet", path="x", input_shape=(28, 28, 1), num_classes=10)
    assert (data.input, data.label, data.resize) == ("image", "label", False)
    with pytest.raises(UsageError, match=r"^data.num_classes: missing; parquet data needs it"):
        Data("parquet", path="x", input_shape=(28, 28, 1))
    with pytest.raises(UsageError, match=r"^data.input: only used with dataset = 'parquet'"):
        Data("folder", path="x", input_shape=(28, 28, 1), num_classes=10, input="image")


def test_files_of_one_split_that_differ_in_type_are_one_line(mnist_parquet, tmp_path):
    root = tmp_path / "tables"
    root.mkdir()
    table = pq.read_table(mnist_parquet / "train.parquet")
    pq.write_table(table, root / "train-0.parquet")
    pq.write_table(table.set_column(1, "label", table.column(1).cast(pa.int32())),
                   root / "train-1.parquet")  # fmt: skip
    pq.write_table(table, root / "test.parquet")
    with pytest.raises(UsageError, match=r"train-1.parquet's columns differ in type from .*"
                       r"train-0.parquet's; write the files alike"):  # fmt: skip
        load_data(parquet(root), None)
