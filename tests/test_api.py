"""The Python API: `hvd_train.train` inside a job started by horovodrun, and `hvd_train.launch`
starting the ranks itself with Horovod's `horovod.run`, both with a recipe made in code."""

import json
import subprocess
import sys

import pytest

from tests.conftest import FRAMEWORKS
from tests.horovodrun import TIMEOUT, horovodrun, script

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(900)]


def summary_line(output: str) -> dict:
    lines = [line.split("SUMMARY ", 1)[1] for line in output.splitlines() if "SUMMARY " in line]
    assert len(lines) == 1, output
    return json.loads(lines[0])


def check(summary: dict, framework: str, output_dir) -> None:
    assert summary == json.loads((output_dir / "summary.json").read_text())
    assert summary["framework"] == framework and summary["world_size"] == 2
    assert summary["recipe"] == "recipe" and summary["epochs"] == 2
    assert summary["test_accuracy"] >= 0.97, summary  # the data allows 100%


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_train_inside_a_job(framework, tmp_path):
    result = horovodrun(script("api_script.py"), "train", framework, str(tmp_path))
    check(summary_line(result.stdout), framework, tmp_path)


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_launch_starts_the_ranks_and_returns_rank_zeros_summary(framework, tmp_path):
    command = [sys.executable, script("api_script.py"), "launch", framework, str(tmp_path)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT)
    assert result.returncode == 0, result.stdout + result.stderr
    check(summary_line(result.stdout), framework, tmp_path)


def run_launch_script(case: str, output_dir) -> tuple[str, str]:
    """launch_script.py CASE in a fresh process: what it printed last, and all its output."""
    command = [sys.executable, script("launch_script.py"), case, str(output_dir)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT)
    output = result.stdout + result.stderr
    assert result.returncode == 0 and "Traceback" not in output, output
    return result.stdout.splitlines()[-1], output


@pytest.mark.torch
def test_launch_works_from_a_script_without_a_main_guard(tmp_path):
    last, output = run_launch_script("trains", tmp_path)
    assert last.startswith("SUMMARY "), output
    summary = json.loads(last.removeprefix("SUMMARY "))
    assert summary["world_size"] == 2 and summary["test_accuracy"] >= 0.9, summary


@pytest.mark.torch
def test_launch_refuses_a_mistake_before_any_rank_starts(tmp_path):
    last, output = run_launch_script("usage", tmp_path)
    assert last == (
        "RAISED UsageError: override schedule.epochs: 0 is out of range; it must be positive"
    ), output
    assert "<stdout>" not in output and "<stderr>" not in output  # no rank said anything
    assert not any(tmp_path.iterdir())


@pytest.mark.torch
def test_a_mistake_found_in_the_ranks_comes_back_once_as_rank_zeros(tmp_path):
    last, output = run_launch_script("rank-failure", tmp_path)
    assert last == (
        f"RAISED UsageError: rank 0: data directory {tmp_path}/no-such-folder does not exist; "
        "fix --data-dir or HVD_TRAIN_DATA_DIR"
    ), output
    assert output.count("does not exist") == 1, output


@pytest.mark.torch
def test_the_launch_command_starts_the_ranks_and_says_how_it_went(tmp_path):
    command = [sys.executable, "-m", "hvd_train", "launch", "-np", "2", "--recipe",
               script("api_script.py"), "--framework", "torch", "--epochs", "1",
               "--output-dir", str(tmp_path)]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT)
    assert result.returncode == 0, result.stdout + result.stderr
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["epochs"] == 1
    assert result.stdout.splitlines()[-1] == (
        f"hvd-train launch: api_script under torch on 2 ranks (horovod): test loss "
        f"{summary['test_loss']:.4f}, test accuracy {summary['test_accuracy']:.2%} after "
        f"{summary['train_seconds']:.1f} s of training"
    )


@pytest.mark.torch
def test_the_launch_command_names_a_rank_that_was_killed_in_one_line(tmp_path):
    recipe = tmp_path / "killed.py"
    recipe.write_text(
        "import os, signal\n"
        "import numpy as np\n"
        "from torch import nn\n"
        "from hvd_train import Recipe\n\n"
        "def data():\n"
        "    if os.environ.get('HOROVOD_RANK') == '1':  # as the OOM killer would\n"
        "        os.kill(os.getpid(), signal.SIGKILL)\n"
        "    x = np.zeros((64, 4), np.float32)\n"
        "    return (x, np.zeros(64, np.int64)), (x, np.zeros(64, np.int64))\n\n"
        "recipe = Recipe(data=data, torch_model=lambda: nn.Linear(4, 2))\n"
    )
    command = [sys.executable, "-m", "hvd_train", "launch", "-np", "2", "--recipe", str(recipe),
               "--framework", "torch", "--output-dir", str(tmp_path / "run")]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT)
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.splitlines()[-1] == (
        "hvd-train: error: rank 1 was killed by SIGKILL (out of memory?); the job was stopped"
    )
