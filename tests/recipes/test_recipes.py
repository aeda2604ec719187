"""Recipes beyond MNIST's TOML under the real `horovodrun -np 2`: the user's own arrays (npz),
and every Python example under each framework it supports. A framework's runs train one after
another in one job (cli_runs.py), and each test reads what its run wrote and printed."""

import functools
import importlib.util
import json
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import FRAMEWORKS, REPO
from tests.helpers import evaluation
from tests.horovodrun import trainings

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(1200)]

EXAMPLES = REPO / "recipes" / "examples"
# Every example under each framework it supports (a torch module: torch; Keras: both).
EXAMPLE_RUNS = [
    pytest.param("mnist_resnet_torch.py", "torch", marks=pytest.mark.torch),
    pytest.param("mnist_resnet_keras.py", "torch", marks=pytest.mark.torch),
    pytest.param("mnist_resnet_keras.py", "tensorflow", marks=pytest.mark.tensorflow),
]
NPZ_RECIPE = """
[data]
dataset = "npz"
path = "arrays.npz"          # beside this file
input_shape = [12, 12, 1]
num_classes = 4

[model]
layers = [
  { type = "conv2d", filters = 8, kernel_size = 3, padding = "same" },
  { type = "relu" },
  { type = "maxpool2d", pool_size = 2 },
  { type = "flatten" },
  { type = "dense", units = 4 },
  { type = "softmax" },
]

[optimizer]
learning_rate = 0.005

[schedule]
epochs = 2
batch_size = 32
"""


def write_learnable_npz(path: Path) -> None:
    """Four classes of 12x12 images: a bright 4x4 square in one of the four corners, on noise.
    The data allows 100% accuracy."""
    rng = np.random.default_rng(1)
    arrays = {}
    for part, count in (("train", 3000), ("test", 600)):
        labels = rng.integers(0, 4, count)
        images = rng.integers(0, 80, (count, 12, 12, 1))
        for label, (row, col) in enumerate([(1, 1), (1, 7), (7, 1), (7, 7)]):
            images[labels == label, row : row + 4, col : col + 4] += 150
        arrays[f"x_{part}"], arrays[f"y_{part}"] = images.astype(np.uint8), labels
    np.savez(path, **arrays)


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_an_npz_recipe_trains_to_what_the_data_allows(framework, run):
    summary = run("npz", framework).summary
    assert summary["world_size"] == 2 and summary["test_accuracy"] >= 0.98, summary


def test_the_example_list_covers_every_example():
    # The others each have a test of their own below, the own loops in test_own_loops.py.
    own = {"regression.py", "tagging.py", "text_parquet.py", "resnet18_folder.py",
           "ported_script.py", "own_loop_torch.py", "own_loop_tensorflow.py",
           "own_loop_lamb.py"}  # fmt: skip
    covered = {p.values[0] for p in EXAMPLE_RUNS} | own
    assert covered == {p.name for p in EXAMPLES.glob("*.py")}


def recipe_runs(framework: str, data: Path, mnist_dir: Path) -> dict[str, list[str]]:
    """The runs each test below reads, by name: their `hvd-train` arguments under `framework`
    (a torch module's recipes under torch only), with what they read written into `data`."""
    write_learnable_npz(data / "arrays.npz")
    (data / "mine.toml").write_text(NPZ_RECIPE)
    mnist = ["--data-dir", str(mnist_dir)]
    runs = {
        "npz": ["--recipe", str(data / "mine.toml")],
        # 16 images per rank a step, two epochs of 32 steps: the model's compute is the time.
        "resnet18": ["--recipe", "resnet18", "--epochs", "2", "--set", "train_samples=1024",
                     "--set", "test_samples=256", "--set", "batch_size=16",
                     "--set", "overlap=true"],
        "ported_script.py": ["--recipe", str(EXAMPLES / "ported_script.py"), *mnist,
                             "--epochs", "1"],
        "tagging.py": ["--recipe", str(EXAMPLES / "tagging.py")],
        "text_parquet.py": ["--recipe", str(EXAMPLES / "text_parquet.py")],
        **{example: ["--recipe", str(EXAMPLES / example), *mnist]
           for example, example_framework in (p.values for p in EXAMPLE_RUNS)
           if example_framework == framework},
    }  # fmt: skip
    if framework == "torch":
        # A smoke run of ResNet-18 on image files (slow on CPUs): 64 images a split, 4 steps.
        subprocess.run([sys.executable, str(REPO / "scripts" / "make-image-folder"),
                        str(data / "images"), *mnist, "--limit", "64"],
                       check=True, capture_output=True)  # fmt: skip
        runs["resnet18_folder.py"] = ["--recipe", str(EXAMPLES / "resnet18_folder.py"),
                                      "--epochs", "1", "--limit-steps", "4"]  # fmt: skip
        runs["regression.py"] = ["--recipe", str(EXAMPLES / "regression.py")]
    return runs


@dataclass
class Run:
    output: Path  # its --output-dir
    printed: str  # what it printed, stdout then stderr, every rank's lines

    @property
    def summary(self) -> dict:
        return json.loads((self.output / "summary.json").read_text())


@pytest.fixture(scope="module")
def run(mnist_dir, tmp_path_factory) -> Callable[[str, str], Run]:
    """run(NAME, FRAMEWORK): NAME of recipe_runs, trained under horovodrun -np 2 with every
    other run of that framework in one job, once per module."""

    @functools.cache
    def trained(framework: str) -> dict[str, Run]:
        out = tmp_path_factory.mktemp(f"recipes-{framework}")
        runs = recipe_runs(framework, out, mnist_dir)
        with pytest.MonkeyPatch.context() as environment:
            environment.setenv("HVD_TRAIN_CACHE", str(out / "cache"))
            environment.setenv("HVD_TRAIN_IMAGES", str(out / "images"))
            printed = trainings(*[[*arguments, "--framework", framework,
                                   "--output-dir", str(out / name)]
                                  for name, arguments in runs.items()])  # fmt: skip
        return {name: Run(out / name, text) for name, text in zip(runs, printed, strict=True)}

    return lambda name, framework: trained(framework)[name]


@pytest.mark.slow
@pytest.mark.parametrize(("example", "framework"), EXAMPLE_RUNS)
def test_every_example_reaches_98_percent_after_one_epoch(example, framework, run):
    summary = run(example, framework).summary
    print(f"{example} under {framework}: {summary}")
    assert summary["epochs"] == 1 and summary["world_size"] == 2
    assert summary["test_accuracy"] >= 0.98


@pytest.mark.slow
@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_the_ported_script_trains_with_its_own_optimizer_schedule_and_callback(framework, run):
    # LAMB (torch's written in the recipe, Keras's own), one cycle, a validation split watched
    # by early stopping and the best checkpoint, a callback: one epoch of the three.
    ported = run("ported_script.py", framework)
    output, summary = ported.output, ported.summary
    assert summary["test_accuracy"] >= 0.98 and summary["val_accuracy"] >= 0.98, summary
    lines = [line.partition("<stdout>:")[2] for line in ported.printed.splitlines()]
    logged = [line for line in lines if line.startswith("evaluation ")]
    steps = [int(line.split(" at step ")[1].split(":")[0]) for line in logged]
    assert steps == [200, 400, 422], logged  # 54,000 examples in 128 a step; val and test once
    records = [json.loads(line) for line in (output / "metrics.jsonl").read_text().splitlines()]
    rates = [r["learning_rate"] for r in records if r["kind"] == "train"]
    peak = 0.004 * 2  # the recipe's own rate, scaled with the world size
    assert max(rates) == pytest.approx(peak, rel=0.02) and rates[-1] < peak / 10
    assert len(list((output / "best").iterdir())) == 1


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.tensorflow
@pytest.mark.parametrize(("writer", "reader"), [("torch", "tensorflow"), ("tensorflow", "torch")])
def test_a_keras_models_checkpoint_scores_the_same_under_the_other_framework(
    writer, reader, run, mnist_dir
):
    written = run("mnist_resnet_keras.py", writer)
    result = evaluation(written.output, "--framework", reader, "--data-dir", str(mnist_dir))
    written = written.summary
    assert result["written_by"] == writer and result["framework"] == reader
    assert abs(result["test_accuracy"] - written["test_accuracy"]) <= 0.0005
    assert result["test_loss"] == pytest.approx(written["test_loss"], abs=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_resnet18_learns_its_synthetic_task_with_the_exchange_overlapped(framework, run):
    # Two epochs of 32 steps: the first's steep learning rate leaves batchnorm's running
    # statistics behind under Keras (test accuracy 31-62% after it), the second settles them
    # (100% under both, 2026-11-25).
    ran = run("resnet18", framework)
    output, summary = ran.output, ran.summary
    lines = [json.loads(line) for line in (output / "metrics.jsonl").read_text().splitlines()]
    losses = [line["loss"] for line in lines if line["kind"] == "train"]
    assert summary["world_size"] == 2 and summary["settings"]["horovod"]["overlap"] is True
    assert losses[1] < losses[0] < 2.3  # below chance's loss (ln 10) after one epoch
    assert summary["test_accuracy"] >= 0.95, summary


def load_example(path: Path):
    """An example recipe's module, imported as a user's code would import it."""
    spec = importlib.util.spec_from_file_location(f"example_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.torch
def test_the_regression_example_reports_mse_exactly_over_the_test_set(run):
    ran = run("regression.py", "torch")
    output, summary = ran.output, ran.summary
    assert summary["world_size"] == 2 and "test_accuracy" not in summary
    assert summary["test_mse"] < 0.03, summary  # predicting the mean: about 2.1
    # One process's reference, without hvd_train: the saved weights in the recipe's module,
    # over the whole test set (1 + 2000 examples: the ranks take uneven slices).
    import torch
    from safetensors.torch import load_file

    example = load_example(EXAMPLES / "regression.py")
    _, (x, y) = example.data()
    model = example.model()
    newest = sorted((output / "checkpoints").iterdir())[-1]
    model.load_state_dict(load_file(newest / "model.safetensors"))
    with torch.no_grad():
        outputs = model(torch.from_numpy(x)).numpy()[:, 0].astype(np.float64)
    assert summary["test_mse"] == pytest.approx(np.mean((outputs - y) ** 2), rel=1e-6)
    assert summary["test_mae"] == pytest.approx(np.mean(np.abs(outputs - y)), rel=1e-6)
    evals = [json.loads(line) for line in (output / "metrics.jsonl").read_text().splitlines()]
    assert [r["test_mse"] for r in evals if r["kind"] == "eval"][-1] == summary["test_mse"]


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_the_tagging_example_learns_a_tag_per_position(framework, run):
    ran = run("tagging.py", framework)
    output, summary = ran.output, ran.summary
    assert summary["world_size"] == 2 and summary["test_accuracy"] >= 0.98, summary
    # The same checkpoint in one process: the same per-position accuracy over all 1001 x 24.
    alone = evaluation(output, "--framework", framework)
    assert alone["world_size"] == 1
    assert alone["test_accuracy"] * 1001 * 24 == pytest.approx(summary["test_accuracy"] * 1001 * 24)


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_the_text_example_classifies_padded_texts_read_from_parquet(framework, run):
    example = EXAMPLES / "text_parquet.py"
    ran = run(example.name, framework)
    output, summary = ran.output, ran.summary
    assert summary["world_size"] == 2 and summary["test_accuracy"] >= 0.95, summary
    if framework == "tensorflow":
        return
    # One process's reference, without hvd_train: the saved weights on each text alone, not
    # padded, over the whole test set.
    import torch
    from safetensors.torch import load_file

    module = load_example(example)
    _, test = module.data()
    model = module.torch_model()
    newest = sorted((output / "checkpoints").iterdir())[-1]
    model.load_state_dict(load_file(newest / "model.safetensors"))
    texts, labels = test[np.arange(len(test))]
    with torch.no_grad():
        guesses = [int(model(torch.tensor(t)[None], torch.ones(1, len(t), dtype=torch.bool))
                       .argmax()) for t in texts["tokens"]]  # fmt: skip
    assert summary["test_accuracy"] == pytest.approx(np.mean(np.array(guesses) == labels))


@pytest.mark.torch
def test_the_resnet18_folder_example_reads_augments_and_trains(run):
    summary = run("resnet18_folder.py", "torch").summary
    assert summary["world_size"] == 2 and summary["settings"]["data"]["workers"] == "auto"
    transforms = [t["type"] for t in summary["settings"]["data"]["transforms"]]
    assert transforms == ["random_crop", "horizontal_flip", "normalize"]
    assert np.isfinite(summary["test_loss"]) and summary["images_per_second"] > 0, summary
