"""The CLI as a user meets it: `python -m hvd_train` in real subprocesses.

BAD_INPUTS mirrors the table of mistakes in docs/faults.md: each gets one line naming the problem
and the fix, exit code 2, no traceback, and leaves a run's saved checkpoint untouched.
"""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from hvd_train.distributed.checkpoint_files import save_checkpoint
from hvd_train.recipe import load_recipe
from hvd_train.recipe.layers import neutral_weight_shapes
from hvd_train.recipe.toml import recipe_toml
from tests.conftest import FRAMEWORKS, REPO
from tests.helpers import hvd_train

GOOD_RECIPE = (REPO / "recipes" / "mnist_cnn.toml").read_text()


def assert_usage_error(result: subprocess.CompletedProcess, message: str) -> None:
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert lines and lines[-1].startswith("hvd-train: error: "), result.stderr
    assert message in lines[-1], lines[-1]
    assert "Traceback" not in result.stderr


def test_help_explains_every_flag():
    assert hvd_train("--help").returncode == 0
    train_help = hvd_train("train", "--help").stdout
    for flag in ("--recipe", "--set", "--framework", "--epochs", "--batch-size", "--lr", "--seed",
                 "--data-dir", "--output-dir", "--resume", "--checkpoint-every",
                 "--keep-checkpoints", "--limit-steps", "--log-every", "--track",
                 "--debug"):  # fmt: skip
        assert flag in train_help
    assert "--checkpoint" in hvd_train("eval", "--help").stdout


def recipe_with(tmp_path: Path, old: str, new: str) -> str:
    assert old in GOOD_RECIPE
    path = tmp_path / "recipe.toml"
    path.write_text(GOOD_RECIPE.replace(old, new))
    return str(path)


def python_recipe(tmp_path: Path, optimizer: str) -> str:
    path = tmp_path / "mine.py"
    path.write_text(
        "from hvd_train import Data, Optimizer, Recipe\n"
        f"recipe = Recipe(data=Data('mnist'), keras_model=print, optimizer={optimizer})\n"
    )
    return str(path)


def npz_recipe(tmp_path: Path, labels: int | None) -> str:
    """A recipe reading data.npz beside it, whose labels go up to `labels` - 1 (no file if
    None)."""
    if labels is not None:
        np.savez(tmp_path / "data.npz", x_train=np.zeros((8, 28, 28, 1), np.uint8),
                 y_train=np.arange(labels - 8, labels), x_test=np.zeros((4, 28, 28)),
                 y_test=np.arange(4))  # fmt: skip
    text = GOOD_RECIPE.replace('dataset = "mnist"', 'dataset = "npz"\npath = "data.npz"')
    (tmp_path / "npz.toml").write_text(text)
    return str(tmp_path / "npz.toml")


def damaged_data(tmp_path: Path, mnist_dir: Path, damage) -> str:
    copy = tmp_path / "data"
    shutil.copytree(mnist_dir, copy)
    damage(copy / "train-labels-idx1-ubyte.gz")
    return str(copy)


def fake_modules(tmp_path: Path, modules: dict[str, str]) -> dict[str, str]:
    """A PYTHONPATH entry whose modules shadow the real ones, each running the given code."""
    for name, code in modules.items():
        path = tmp_path / "fake" / Path(*name.split(".")) / "__init__.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(code)
    return {"PYTHONPATH": f"{tmp_path / 'fake'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:100])


def flip_a_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-10] ^= 0xFF
    path.write_bytes(bytes(data))


# (row id, arguments or a function of (tmp_path, mnist_dir, framework) giving (arguments, env),
#  the expected message). Rows run with --resume on a run that holds a checkpoint.
BAD_INPUTS = [
    ("unknown framework", ["--framework", "jax"], "argument --framework: invalid choice: 'jax'"),
    ("unknown recipe", ["--recipe", "nope"],
     "unknown recipe 'nope'; use one of mnist_bn, mnist_cnn"),
    ("recipe syntax error",
     lambda t, d, f: (["--recipe", recipe_with(t, "epochs = 2", "epochs = [")], {}),
     "recipe.toml: not valid TOML"),
    ("unknown layer",
     lambda t, d, f: (["--recipe", recipe_with(t, '"relu" }', '"gelu" }')], {}),
     "model.layers[1].type: unknown value 'gelu'; choose one of conv2d"),
    ("missing model layers",
     lambda t, d, f: (["--recipe", recipe_with(t, "layers = [", "layer = [")], {}),
     "model.layer: unknown key; check its spelling"),
    ("zero hyperparameter in the recipe",
     lambda t, d, f: (["--recipe", recipe_with(t, "epochs = 2", "epochs = 0")], {}),
     "schedule.epochs: 0 is out of range; it must be positive"),
    ("negative hyperparameter in the recipe",
     lambda t, d, f: (["--recipe", recipe_with(t, "learning_rate = 0.001", "learning_rate = -1")],
                      {}),
     "optimizer.learning_rate: -1.0 is out of range; it must be positive"),
    ("non-finite hyperparameter in the recipe",
     lambda t, d, f: (["--recipe", recipe_with(t, "learning_rate = 0.001", "learning_rate = nan")],
                      {}),
     "optimizer.learning_rate: nan is not a finite number; give a finite value"),
    ("override of an unknown setting", ["--set", "schedule.epoch=2"],
     "override schedule.epoch: unknown setting; use section.key"),
    ("override of a renamed setting", ["--set", "horovod.fp16_compression=true"],
     'override horovod.fp16_compression: renamed; use horovod.compression="fp16"'),
    ("unknown compression", ["--set", "horovod.compression=int8"],
     "override horovod.compression: unknown value 'int8'; choose one of none, fp16, bf16"),
    ("override out of range", ["--set", "optimizer.momentum=1.5"],
     "override optimizer.momentum: 1.5 is out of range; it must be below 1.0"),
    ("early stopping without a validation split",
     ["--set", "schedule.early_stopping={ monitor = 'val_loss', patience = 2 }"],
     "override schedule.early_stopping: it watches the validation split, which this recipe has "
     "none of; set data.validation_fraction (0.1 is usual)"),
    ("unknown tracker", ["--track", "wandb"],
     "--track: unknown tracker 'wandb'; choose from mlflow, csv"),
    ("unknown tracker in the recipe", ["--set", "output.trackers=['wandb']"],
     "override output.trackers: unknown tracker 'wandb'; choose from mlflow, csv"),
    ("setting that needs another",
     ["--set", "optimizer.name=sgd", "--set", "optimizer.nesterov=true"],
     "override optimizer.nesterov: Nesterov momentum needs a momentum above 0"),
    ("setting nothing chosen reads", ["--set", "optimizer.momentum=0.9"],
     'override optimizer.momentum: set, but nothing chosen reads it (only optimizer.name = "sgd" '
     'or "rmsprop" does); choose that, or leave momentum out'),
    ("override of the wrong type", ["--set", "schedule.batch_size=big"],
     "override schedule.batch_size: expected int, got 'big'"),
    ("override without a value", ["--set", "epochs"],
     "argument --set: expected section.key=value, got 'epochs'"),
    ("mistake in a Python recipe",
     lambda t, d, f: (["--recipe", python_recipe(t, "Optimizer(learning_rate=0)")], {}),
     "mine.py: optimizer.learning_rate: 0.0 is out of range; it must be positive"),
    ("a table key beside a Python recipe's own optimizer",
     lambda t, d, f: (["--recipe", python_recipe(t, "print"), "--set",
                       "optimizer.weight_decay=0.1"], {}),
     "override optimizer.weight_decay: the optimizer is made by optimizer.function; give this "
     "setting to the optimizer it makes (only gradient_clip_norm applies beside it)"),
    ("npz data with labels out of range",
     lambda t, d, f: (["--recipe", npz_recipe(t, labels=12)], {}),
     "y_train has labels from 4 to 11, outside 0 to 9; fix the labels or data.num_classes"),
    ("npz data that does not exist",
     lambda t, d, f: (["--recipe", npz_recipe(t, labels=None)], {}),
     "data.npz does not exist; fix the path (it is relative to the recipe file)"),
    ("zero flag", ["--epochs", "0"], "argument --epochs: must be positive, got '0'"),
    ("non-finite flag", ["--lr", "nan"], "argument --lr: must be a finite number, got 'nan'"),
    ("non-finite override", ["--set", "optimizer.learning_rate=inf"],
     "override optimizer.learning_rate: inf is not a finite number; give a finite value"),
    ("negative flag", ["--lr", "-0.1"], "argument --lr: must be positive, got '-0.1'"),
    ("non-integer batch size flag", ["--batch-size", "6.5"],
     "argument --batch-size: expected a positive int, got '6.5'"),
    ("non-integer batch size in the recipe",
     lambda t, d, f: (["--recipe", recipe_with(t, "batch_size = 64", "batch_size = 6.5")], {}),
     "schedule.batch_size: expected int, got 6.5"),
    ("missing data directory",
     lambda t, d, f: (["--data-dir", str(t / "nowhere")], {}),
     "nowhere does not exist; fix --data-dir or HVD_TRAIN_DATA_DIR"),
    ("truncated data file",
     lambda t, d, f: (["--data-dir", damaged_data(t, d, truncate)], {}),
     "train-labels-idx1-ubyte.gz is truncated (100 of 28881 bytes); delete it"),
    ("data file with the wrong checksum",
     lambda t, d, f: (["--data-dir", damaged_data(t, d, flip_a_byte)], {}),
     "train-labels-idx1-ubyte.gz has the wrong checksum"),
    ("Horovod built without the framework",
     lambda t, d, f: ([], fake_modules(t, {"horovod": "", f"horovod.{f}": (
         f"raise ImportError('Extension horovod.{f} has not been built')")})),
     "Horovod is missing or was built without"),
    ("framework not installed",
     lambda t, d, f: ([], fake_modules(t, {f: (
         f"raise ModuleNotFoundError(\"No module named '{f}'\", name='{f}')")})),
     "which is not installed"),
]  # fmt: skip


@pytest.fixture
def saved_run(tmp_path) -> Path:
    """A run directory holding one checkpoint of mnist_cnn."""
    run_dir = tmp_path / "run"
    recipe = load_recipe("mnist_cnn")
    shapes = neutral_weight_shapes(recipe.layers, recipe.data.input_shape)
    weights = {name: np.zeros(shape, np.float32) for name, shape in shapes.items()}
    state = {"epoch": 1, "samples_in_epoch": 0, "recipe": "mnist_cnn", "layout": "neutral",
             "framework": "torch", "seed": 42, "limit_steps": None,
             "recipe_source": "recipes/mnist_cnn.toml"}  # fmt: skip
    save_checkpoint(run_dir / "checkpoints", "epoch-0001-sample-00000000", weights, {}, state,
                    recipe_toml(recipe), 3)  # fmt: skip
    return run_dir


def snapshot(run_dir: Path) -> dict[str, bytes]:
    return {str(p): p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}


@pytest.mark.parametrize("framework", FRAMEWORKS)
@pytest.mark.parametrize(("row", "given", "message"), BAD_INPUTS, ids=[r[0] for r in BAD_INPUTS])
def test_bad_input_is_one_line_exit_2_and_loses_nothing(
    row, given, message, framework, tmp_path, mnist_dir, saved_run
):
    arguments, env = given(tmp_path, mnist_dir, framework) if callable(given) else (given, {})
    before = snapshot(saved_run)
    defaults = ["--framework", framework, "--data-dir", str(mnist_dir)]
    result = hvd_train(*defaults, "--output-dir", str(saved_run), *arguments, env=env)
    assert_usage_error(result, message)
    assert snapshot(saved_run) == before


# Flags that contradict the checkpoint of `saved_run` (mnist_cnn, seed 42, all steps).
RESUME_MISMATCHES = [
    (["--seed", "7"], "--resume: --seed 7 differs from the run's 42 (checkpoint "),
    (["--limit-steps", "5"], "--resume: --limit-steps 5 differs from the run's none"),
    (["--lr", "0.5"], "--resume: optimizer.learning_rate is 0.5 here but 0.001 in checkpoint "),
    (["--batch-size", "32"], "--resume: schedule.batch_size is 32 here but 64 in checkpoint "),
    (["--set", "horovod.compression=bf16"],
     "--resume: horovod.compression is 'bf16' here but 'none' in checkpoint "),
    (["--recipe", "mnist_bn"], "--resume: model.layers is another value here but another value"),
]  # fmt: skip


@pytest.mark.parametrize("framework", FRAMEWORKS)
@pytest.mark.parametrize(("arguments", "message"), RESUME_MISMATCHES, ids=lambda a: str(a))
def test_resume_refuses_what_contradicts_the_checkpoint(
    arguments, message, framework, mnist_dir, saved_run
):
    before = snapshot(saved_run)
    result = hvd_train("--resume", "--output-dir", str(saved_run), "--data-dir", str(mnist_dir),
                 "--framework", framework, *arguments)  # fmt: skip
    assert_usage_error(result, message)
    assert "leave" in result.stderr and snapshot(saved_run) == before


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_unwritable_output_dir(framework, tmp_path, mnist_dir):
    (tmp_path / "file").write_text("")
    output = tmp_path / "file" / "run"
    result = hvd_train(
        "--framework", framework, "--data-dir", str(mnist_dir), "--output-dir", str(output)
    )
    assert_usage_error(result, "cannot write to output directory")


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_resume_with_nothing_to_resume(framework, tmp_path, mnist_dir):
    arguments = ["--framework", framework, "--data-dir", str(mnist_dir), "--resume"]
    assert_usage_error(hvd_train(*arguments, "--output-dir", str(tmp_path)), "nothing to resume")
    assert_usage_error(hvd_train(*arguments), "--resume needs --output-dir")


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_a_new_run_never_overwrites_saved_checkpoints(framework, mnist_dir, saved_run):
    before = snapshot(saved_run)
    arguments = ["--framework", framework, "--data-dir", str(mnist_dir)]
    result = hvd_train(*arguments, "--output-dir", str(saved_run))
    assert_usage_error(result, "already holds checkpoints; pass --resume")
    assert snapshot(saved_run) == before


@pytest.mark.torch
def test_a_python_recipe_whose_model_changed_since_its_checkpoint_is_refused(tmp_path):
    # The checkpoint holds an nn.Linear(16, 2); the recipe's code now builds an nn.Linear(16, 3).
    recipe = tmp_path / "mine.py"
    code = (
        "import numpy as np\nfrom torch import nn\nfrom hvd_train import Recipe\n"
        "def data():\n    x = np.zeros((8, 16), np.float32)\n"
        "    return (x, np.arange(8) % 2), (x, np.arange(8) % 2)\n"
        "recipe = Recipe(data=data, torch_model=lambda: nn.Linear(16, OUT))\n"
    )
    recipe.write_text(code.replace("OUT", "3"))
    shown = hvd_train("show-recipe", "--recipe", str(recipe)).stdout
    run_dir = tmp_path / "run"
    state = {"epoch": 0, "samples_in_epoch": 8, "recipe": "mine", "layout": "torch",
             "framework": "torch", "seed": 42, "limit_steps": None,
             "recipe_source": f"{recipe}:recipe"}  # fmt: skip
    weights = {"weight": np.zeros((2, 16), np.float32), "bias": np.zeros(2, np.float32)}
    save_checkpoint(run_dir / "checkpoints", "epoch-0000-sample-00000008", weights, {}, state,
                    shown, 3)  # fmt: skip
    before = snapshot(run_dir)
    result = hvd_train("--resume", "--output-dir", str(run_dir))
    assert_usage_error(
        result,
        "was written for another model (recipe 'mine'; weight: (2, 16) there, (3, 16) here); "
        "resume with that recipe or choose another --output-dir",
    )
    assert snapshot(run_dir) == before


def test_resume_from_the_other_framework_is_refused(mnist_dir, saved_run):
    arguments = ["--framework", "tensorflow", "--data-dir", str(mnist_dir), "--resume"]
    result = hvd_train(*arguments, "--output-dir", str(saved_run))
    assert_usage_error(result, "was written by torch; resume it with --framework torch")


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_eval_of_a_missing_checkpoint(framework, tmp_path):
    result = hvd_train("eval", "--framework", framework, "--checkpoint", str(tmp_path / "none"))
    assert_usage_error(result, "none does not exist; check --checkpoint")
    result = hvd_train("eval", "--framework", framework, "--checkpoint", str(tmp_path))
    assert_usage_error(result, "is neither a checkpoint nor a run directory holding one")


def test_debug_shows_the_traceback():
    result = hvd_train("--recipe", "nope", "--debug")
    assert result.returncode != 0 and "Traceback" in result.stderr


def test_elastic_under_tensorflow_is_refused(tmp_path):
    result = hvd_train("--framework", "tensorflow", "--elastic", "--output-dir", str(tmp_path))
    assert_usage_error(result, "--elastic is not available with --framework tensorflow")
    result = hvd_train("--elastic")
    assert_usage_error(result, "--elastic needs --output-dir, a folder that every host sees")


def test_a_torch_only_recipe_under_tensorflow_is_refused(tmp_path):
    path = tmp_path / "torch_only.py"
    path.write_text("from hvd_train import Data, Recipe\nrecipe = Recipe(data=Data('mnist'), "
                    "torch_model=print)\n")  # fmt: skip
    result = hvd_train("--framework", "tensorflow", "--recipe", str(path))
    assert_usage_error(
        result, "recipe 'torch_only' supports torch only (it gives torch_model); use "
        "--framework torch, or give the recipe a keras_model"
    )  # fmt: skip


@pytest.mark.torch
def test_a_torch_model_training_parameters_of_two_dtypes_is_one_line(tmp_path, mnist_dir):
    path = tmp_path / "two_dtypes.py"
    path.write_text(
        "import torch\nfrom hvd_train import Data, Recipe\n"
        "def model():\n"
        "    linear = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(784, 10))\n"
        "    linear.register_parameter('scale', torch.nn.Parameter(torch.ones(1).double()))\n"
        "    return linear\n"
        "recipe = Recipe(data=Data('mnist'), torch_model=model)\n"
    )
    result = hvd_train("--framework", "torch", "--recipe", str(path), "--data-dir",
                       str(mnist_dir), "--output-dir", str(tmp_path / "run"))  # fmt: skip
    assert_usage_error(result, "the model trains parameters of several dtypes (float32, float64)")


@pytest.mark.tensorflow
def test_a_loss_branching_on_a_tensor_under_tensorflow_is_one_line(tmp_path):
    path = tmp_path / "branching.py"
    path.write_text(
        "import keras\nfrom hvd_train import Data, Layer, Recipe\n"
        "def loss(logits, labels):\n"
        "    value = keras.ops.mean(keras.ops.sparse_categorical_crossentropy(labels, logits, "
        "from_logits=True))\n"
        "    return value if value < 100 else value / 100\n"
        "recipe = Recipe(data=Data('synthetic'), layers=[Layer('flatten'), "
        "Layer('dense', {'units': 10}), Layer('softmax')], loss=loss)\n"
    )  # fmt: skip
    result = hvd_train("--framework", "tensorflow", "--recipe", str(path), "--limit-steps", "1")
    assert_usage_error(result, "the model or the loss uses a tensor as a Python bool")


def test_show_recipe_prints_the_effective_recipe(tmp_path):
    result = hvd_train("show-recipe", "--recipe", "mnist_bn", "--set", "optimizer.weight_decay=0.5",
                 "--epochs", "7", "--set", "horovod.compression=bf16")  # fmt: skip
    assert result.returncode == 0, result.stderr
    path = tmp_path / "shown.toml"
    path.write_text(result.stdout)
    shown = load_recipe(str(path))
    expected = load_recipe("mnist_bn").with_overrides(
        {"weight_decay": 0.5, "epochs": 7, "compression": "bf16"}
    )
    assert shown.settings_table() == expected.settings_table()
    assert f"hash {expected.recipe_hash()}" in result.stdout.splitlines()[0]


def test_every_flag_passes_through_horovodrun():
    # horovodrun parses the whole command line first; a flag of ours that abbreviates two of
    # its options (as --timeline did --timeline-filename and --timeline-mark-cycles) stops it.
    horovodrun = Path(sys.executable).parent / "horovodrun"
    theirs = set(re.findall(r"--[a-z][a-z-]+", run_horovodrun_help(horovodrun)))
    ours = set(
        re.findall(r"^  (--[a-z][a-z-]+)", hvd_train("train", "--help").stdout, re.MULTILINE)
    )
    assert ours and theirs
    for flag in ours:
        assert len([option for option in theirs if option.startswith(flag)]) <= 1, flag


def run_horovodrun_help(horovodrun: Path) -> str:
    return subprocess.run([str(horovodrun), "--help"], capture_output=True, text=True).stdout


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--backend", "ray", "-H", "a:2"], "hosts does not apply to backend 'ray'"),
        (["--address", "ray://head:10001"], "address does not apply to backend 'horovod'"),
        (["--epochs", "0"], "argument --epochs: must be positive, got '0'"),
        (["--set", "schedule.epochs=0"], "override schedule.epochs: 0 is out of range"),
    ],
)
def test_the_launch_command_refuses_a_mistake_before_any_rank_starts(arguments, message):
    result = hvd_train("launch", "-np", "2", *arguments)
    assert_usage_error(result, message)
    assert "<stdout>" not in result.stdout + result.stderr  # no rank said anything
