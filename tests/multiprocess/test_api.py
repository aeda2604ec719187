"""The Python API: `hvd_train.train` inside a job started by horovodrun, and `hvd_train.launch`
starting the ranks itself with Horovod's `horovod.run`, both with a recipe made in code."""

import json
import subprocess
import sys

import pytest

from tests.conftest import FRAMEWORKS
from tests.multiprocess.conftest import TIMEOUT, horovodrun, script

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
