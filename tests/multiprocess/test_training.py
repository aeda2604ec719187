"""The CLI under the real `horovodrun -np 2`: what is written, by whom, and that it learns."""

import json
import shutil
from pathlib import Path

import pytest

from hvd_train.checkpoint import checkpoint_name
from tests.conftest import FRAMEWORKS
from tests.multiprocess.conftest import STEPS, horovodrun, script

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(900)]


def read_metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(params=FRAMEWORKS)
def first_run(request, short_run):
    return request.param, *short_run(request.param)


def test_only_rank_zero_writes(first_run):
    _, base, _, _ = first_run
    assert sorted(p.name for p in (base / "rank0").iterdir()) == [
        "checkpoints",
        "metrics.jsonl",
        "summary.json",
    ]
    assert [p.name for p in (base / "rank0" / "checkpoints").iterdir()] == [checkpoint_name(1, 0)]
    assert not (base / "rank1").exists()


def test_short_run_learns_far_above_chance(first_run):
    framework, base, _, _ = first_run
    summary = json.loads((base / "rank0" / "summary.json").read_text())
    assert summary["framework"] == framework and summary["world_size"] == 2
    assert summary["global_batch_size"] == 128 and summary["learning_rate"] == pytest.approx(0.002)
    assert summary["test_accuracy"] > 0.85, summary
    metrics = read_metrics(base / "rank0")
    assert [m["step"] for m in metrics if m["kind"] == "train"] == [20, 40, 60]
    assert metrics[-1] == {
        "kind": "eval",
        "epoch": 1,
        "step": STEPS,
        "test_loss": summary["test_loss"],
        "test_accuracy": summary["test_accuracy"],
    }


def test_progress_and_log_lines_come_from_rank_zero_only(first_run):
    _, _, _, output = first_run
    assert "[0]<stdout>:epoch 1/1: train loss" in output
    assert "[0]<stderr>:epoch 1/1:" in output  # the progress bar
    # TensorFlow prints its own banner on import in every process; hvd_train says nothing there.
    rank_one = [line for line in output.splitlines() if line.startswith("[1]<")]
    assert not [line for line in rank_one if "epoch" in line or "hvd-train" in line]


def test_resume_continues_from_the_saved_epoch(first_run, tmp_path):
    _, base, arguments, _ = first_run
    shutil.copytree(base / "rank0", tmp_path / "rank0")  # the shared run stays as it was
    first_loss = read_metrics(tmp_path / "rank0")[0]["loss"]
    leftover = tmp_path / "rank0" / "checkpoints" / ".epoch-0001-sample-00000640.partial-999"
    leftover.mkdir()  # what a writer killed mid-checkpoint leaves
    resume = [*arguments, "--epochs", "2", "--resume"]
    output = horovodrun(script("cli_per_rank.py"), str(tmp_path), *resume).stdout
    assert f"resuming from {tmp_path}/rank0/checkpoints/{checkpoint_name(1, 0)}" in output
    metrics = read_metrics(tmp_path / "rank0")
    epoch_two = [m for m in metrics if m["epoch"] == 2]
    assert [m["step"] for m in epoch_two] == [80, 100, 120, 120]
    # Restored weights start far better than the fresh model's first steps.
    assert epoch_two[0]["loss"] < first_loss / 2
    checkpoints = sorted(p.name for p in (tmp_path / "rank0" / "checkpoints").iterdir())
    assert checkpoints == [checkpoint_name(1, 0), checkpoint_name(2, 0)]  # the leftover is gone
    assert json.loads((tmp_path / "rank0" / "summary.json").read_text())["epochs"] == 2
