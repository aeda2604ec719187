"""The CLI under the real `horovodrun -np 2`: what is written, by whom, and that it learns."""

import json
from pathlib import Path

import pytest

from tests.multiprocess.conftest import horovodrun

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(900)]
STEPS = 60  # per epoch, per rank: enough to learn, quick to run


def read_metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module", params=[pytest.param("torch", marks=pytest.mark.torch)])
def first_run(request, mnist_dir, tmp_path_factory):
    """One epoch of STEPS steps; each rank is given its own --output-dir."""
    base = tmp_path_factory.mktemp(request.param)
    arguments = [
        "--framework",
        request.param,
        "--data-dir",
        str(mnist_dir),
        "--epochs",
        "1",
        "--limit-steps",
        str(STEPS),
        "--log-every",
        "20",
    ]
    result = horovodrun("cli_per_rank.py", str(base), *arguments)
    return request.param, base, arguments, result


def test_only_rank_zero_writes(first_run):
    _, base, _, _ = first_run
    assert sorted(p.name for p in (base / "rank0").iterdir()) == [
        "checkpoints",
        "metrics.jsonl",
        "summary.json",
    ]
    assert [p.name for p in (base / "rank0" / "checkpoints").iterdir()] == ["epoch-0001"]
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
    _, _, _, result = first_run
    output = result.stdout + result.stderr
    assert "[0]<stdout>:epoch 1/1: train loss" in output
    assert "[0]<stderr>:epoch 1/1:" in output  # the progress bar
    assert "[1]<stderr>:" not in output and "[1]<stdout>:" not in output


def test_resume_continues_from_the_saved_epoch(first_run):
    _, base, arguments, _ = first_run
    first_loss = read_metrics(base / "rank0")[0]["loss"]
    result = horovodrun("cli_per_rank.py", str(base), *arguments, "--epochs", "2", "--resume")
    assert f"resuming from {base}/rank0/checkpoints/epoch-0001" in result.stdout
    metrics = read_metrics(base / "rank0")
    epoch_two = [m for m in metrics if m["epoch"] == 2]
    assert [m["step"] for m in epoch_two] == [80, 100, 120, 120]
    # Restored weights start far better than the fresh model's first steps.
    assert epoch_two[0]["loss"] < first_loss / 2
    assert sorted(p.name for p in (base / "rank0" / "checkpoints").iterdir()) == [
        "epoch-0001",
        "epoch-0002",
    ]
    assert json.loads((base / "rank0" / "summary.json").read_text())["epochs"] == 2
