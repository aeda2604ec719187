"""Data workers and sources on disk under the real `horovodrun -np 2`: batches read ahead by
threads train exactly the weights that batches read in the step train, the summary splits out
the wait for data (T_data), and a run whose steps wait for their data says so once, with the
setting to change; a folder of PNG files, a Parquet table of them and ArrayRecord files train
exactly as their arrays in memory would, and a broken image stops the run with one line naming
it."""

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from hvd_train.data.records import write_records
from hvd_train.recipe import load_data, load_recipe, load_source
from tests.conftest import FRAMEWORKS, REPO
from tests.helpers import assert_same_weights, saved_weights
from tests.horovodrun import HOROVODRUN, script, trainings

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(600)]
RECIPE = script("slow_source.py")


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_workers_read_ahead_the_batches_the_step_would_read(framework, tmp_path):
    runs = {workers: tmp_path / f"workers-{workers}" for workers in (0, 3)}
    printed = trainings(*[["--recipe", RECIPE, "--framework", framework, "--log-every", "8",
                           "--set", f"data.workers={workers}", "--output-dir", str(run)]
                          for workers, run in runs.items()])  # fmt: skip
    alone, ahead = (json.loads((run / "summary.json").read_text()) for run in runs.values())
    assert alone["settings"]["data"]["workers"] == 0 and ahead["settings"]["data"]["workers"] == 3
    assert_same_weights(saved_weights(runs[0], 2), saved_weights(runs[3], 2))
    # In the step, every step waits out the source's 10 ms; three threads read while the steps
    # run (torch, 2026-11-25: T_data 10.4 ms in the step, 5.2 ms read ahead).
    assert alone["t_data_ms"] >= 10 and ahead["t_data_ms"] < 0.75 * alone["t_data_ms"]
    said = [line for line in printed[0].splitlines() if "waited for their batches" in line]
    assert len(said) == 1 and "with 0 data workers" in said[0] and "data.workers=N" in said[0]
    assert said[0].startswith("[0]<stdout>:")


@pytest.fixture(scope="module")
def image_folder(mnist_dir, tmp_path_factory) -> Path:
    """The first 300 images of each MNIST split as PNG files in class folders."""
    out = tmp_path_factory.mktemp("mnist-png")
    subprocess.run([sys.executable, str(REPO / "scripts" / "make-image-folder"), str(out),
                    "--data-dir", str(mnist_dir), "--limit", "300"],
                   check=True, capture_output=True)  # fmt: skip
    return out


def small_recipe(path: Path, data: str) -> str:
    path.write_text(f"[data]\n{data}\ninput_shape = [28, 28, 1]\nnum_classes = 10\n" + SMALL)
    return str(path)


SMALL = """
[model]
layers = [{ type = "flatten" }, { type = "dense", units = 10 }, { type = "softmax" }]
[optimizer]
learning_rate = 0.01
[schedule]
epochs = 4
batch_size = 16
"""


@pytest.fixture(scope="module")
def parquet_tables(mnist_dir, tmp_path_factory) -> Path:
    """The first 300 images of each MNIST split as Parquet tables of PNG files."""
    out = tmp_path_factory.mktemp("mnist-parquet")
    subprocess.run([sys.executable, str(REPO / "scripts" / "make-parquet"), str(out),
                    "--data-dir", str(mnist_dir), "--limit", "300"],
                   check=True, capture_output=True)  # fmt: skip
    return out


@pytest.fixture(scope="module")
def record_files(image_folder, tmp_path_factory) -> Path:
    """The image folder's examples as ArrayRecord files of 128."""
    out = tmp_path_factory.mktemp("records")
    folder = small_recipe(out / "folder.toml", f'dataset = "folder"\npath = "{image_folder}"')
    write_records(load_source(load_recipe(folder), None), out / "records", per_file=128)
    return out / "records"


@pytest.mark.parametrize(
    ("source", "framework"),
    [("folder", "torch"), ("folder", "tensorflow"), ("parquet", "torch"),
     ("records", "tensorflow")],
)  # fmt: skip
def test_images_on_disk_train_as_the_same_arrays_in_memory_would(
    source, framework, request, tmp_path, monkeypatch
):
    monkeypatch.setenv("HVD_TRAIN_CACHE", str(tmp_path / "cache"))
    # The reference: the source's own pixels and labels, in its order, as an npz in memory.
    fixtures = {"folder": "image_folder", "parquet": "parquet_tables", "records": "record_files"}
    root = request.getfixturevalue(fixtures[source])
    on_disk = f'dataset = "{source}"\npath = "{root}"'
    splits = load_data(load_recipe(small_recipe(tmp_path / "disk.toml", on_disk)), None)
    arrays = {}
    for split, dataset in (("train", splits.train), ("test", splits.test)):
        arrays[f"x_{split}"], arrays[f"y_{split}"] = dataset[np.arange(len(dataset))]
    np.savez(tmp_path / "same.npz", **arrays)
    in_memory = f'dataset = "npz"\npath = "{tmp_path / "same.npz"}"'
    trainings(*[["--recipe", small_recipe(tmp_path / f"{name}.toml", data), "--framework",
                 framework, "--output-dir", str(tmp_path / name)]
                for name, data in ((source, on_disk), ("npz", in_memory))])  # fmt: skip
    summary = json.loads((tmp_path / source / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["test_accuracy"] >= 0.6, summary
    assert_same_weights(saved_weights(tmp_path / source, 4), saved_weights(tmp_path / "npz", 4))


def test_a_broken_image_stops_the_run_naming_its_file(image_folder, tmp_path):
    root = tmp_path / "images"
    shutil.copytree(image_folder, root)
    broken = sorted((root / "train" / "3").iterdir())[1]
    broken.write_bytes(b"not a png")
    recipe = small_recipe(tmp_path / "r.toml", f'dataset = "folder"\npath = "{root}"')
    command = [str(HOROVODRUN), "-np", "2", "--gloo", sys.executable, "-m", "hvd_train",
               "--recipe", recipe, "--output-dir", str(tmp_path / "run")]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    output = result.stdout + result.stderr
    assert result.returncode == 2 and "Traceback" not in output, output
    named = [line for line in output.splitlines() if f"error: {broken} (example " in line]
    assert len(named) == 1 and "is not a readable image" in named[0], output
    assert not (tmp_path / "run" / "checkpoints").exists() or not any(
        (tmp_path / "run" / "checkpoints").iterdir()
    )


def test_a_source_that_hangs_stops_the_job_within_its_timeout(tmp_path, monkeypatch):
    monkeypatch.setenv("HVD_TRAIN_TEST_HANG", "7")  # the read of example 7 never ends
    command = [str(HOROVODRUN), "-np", "2", "--gloo", sys.executable, "-m", "hvd_train",
               "--recipe", RECIPE, "--set", "data.workers=2", "--set", "data.timeout=3",
               "--output-dir", str(tmp_path / "run")]  # fmt: skip
    started = time.monotonic()
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    output = result.stdout + result.stderr
    assert time.monotonic() - started < 90, output
    assert result.returncode == 2 and "Traceback" not in output, output
    assert "the data workers read no batch in 3 s (the batch of examples " in output, output
    assert result.stderr.splitlines()[-1].endswith("exited with code 2; the job was stopped")
