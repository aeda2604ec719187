"""The CLI as a user meets it: `python -m hvd_train`, one process, real subprocesses."""

import subprocess
import sys

import pytest

from hvd_train.checkpoint import save_checkpoint
from hvd_train.recipe import load_recipe
from tests.conftest import FRAMEWORKS


def run(*arguments: str, cwd=None) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "hvd_train", *arguments]
    return subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=cwd)


def assert_usage_error(result: subprocess.CompletedProcess, message: str) -> None:
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert lines and lines[-1].startswith("hvd-train: error: "), result.stderr
    assert message in lines[-1], lines[-1]
    assert "Traceback" not in result.stderr


def test_help_explains_every_flag():
    result = run("--help")
    assert result.returncode == 0
    train_help = run("train", "--help").stdout
    for flag in (
        "--recipe",
        "--framework",
        "--epochs",
        "--batch-size",
        "--lr",
        "--seed",
        "--data-dir",
        "--output-dir",
        "--resume",
        "--limit-steps",
        "--log-every",
    ):
        assert flag in train_help


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--framework", "jax"], "argument --framework: invalid choice: 'jax'"),
        (["--epochs", "0"], "argument --epochs: must be positive, got '0'"),
        (["--batch-size", "6.5"], "argument --batch-size: expected a positive int, got '6.5'"),
        (["--lr", "-1"], "argument --lr: must be positive"),
        (["--recipe", "nope"], "unknown recipe 'nope'; use one of mnist_cnn"),
        (["--resume"], "--resume needs --output-dir"),
    ],
)
def test_bad_flags_get_one_line_and_exit_2(arguments, message):
    assert_usage_error(run(*arguments), message)


def test_recipe_syntax_error_names_the_file(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[schedule\n")
    assert_usage_error(run("--recipe", str(bad)), f"{bad}: not valid TOML")


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_missing_data_dir(framework, tmp_path):
    result = run(
        "--framework", framework, "--data-dir", str(tmp_path / "nowhere"),
        "--output-dir", str(tmp_path / "out"),
    )  # fmt: skip
    assert_usage_error(result, "nowhere does not exist; fix --data-dir or HVD_TRAIN_DATA_DIR")


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_unwritable_output_dir(framework, tmp_path, mnist_dir):
    (tmp_path / "file").write_text("")
    result = run(
        "--framework", framework, "--data-dir", str(mnist_dir),
        "--output-dir", str(tmp_path / "file" / "run"),
    )  # fmt: skip
    assert_usage_error(result, "cannot write to output directory")


def train_in(tmp_path, mnist_dir, framework: str, *extra: str) -> subprocess.CompletedProcess:
    return run(
        "--framework", framework, "--data-dir", str(mnist_dir), "--output-dir", str(tmp_path),
        *extra,
    )  # fmt: skip


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_resume_with_nothing_to_resume(framework, tmp_path, mnist_dir):
    assert_usage_error(train_in(tmp_path, mnist_dir, framework, "--resume"), "nothing to resume")


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_a_new_run_never_overwrites_saved_checkpoints(framework, tmp_path, mnist_dir):
    saved = save_checkpoint(tmp_path / "checkpoints", 3, {}, {}, {"epoch": 3}, "")
    before = {p.name: p.read_bytes() for p in saved.iterdir()}
    result = train_in(tmp_path, mnist_dir, framework)
    assert_usage_error(result, "already holds checkpoints; pass --resume")
    assert {p.name: p.read_bytes() for p in saved.iterdir()} == before


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_checkpoint_of_another_architecture_is_refused(framework, tmp_path, mnist_dir):
    state = {"epoch": 1, "recipe": "other", "architecture": "x", "framework": framework}
    save_checkpoint(tmp_path / "checkpoints", 1, {}, {}, state, "")
    result = train_in(tmp_path, mnist_dir, framework, "--resume")
    assert_usage_error(result, "was written for another model (recipe 'other')")


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_resume_from_the_other_framework_is_refused(framework, tmp_path, mnist_dir):
    other = "tensorflow" if framework == "torch" else "torch"
    architecture = load_recipe("mnist_cnn").architecture_hash()
    state = {"epoch": 1, "recipe": "mnist_cnn", "architecture": architecture, "framework": other}
    save_checkpoint(tmp_path / "checkpoints", 1, {}, {}, state, "")
    result = train_in(tmp_path, mnist_dir, framework, "--resume")
    assert_usage_error(result, f"was written by {other}; resume it with --framework {other}")


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_eval_of_a_missing_checkpoint(framework, tmp_path):
    result = run("eval", "--framework", framework, "--checkpoint", str(tmp_path / "none"))
    assert_usage_error(result, "none does not exist; check --checkpoint")
    result = run("eval", "--framework", framework, "--checkpoint", str(tmp_path))
    assert_usage_error(result, "is neither a checkpoint nor a run directory holding one")
