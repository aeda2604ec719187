"""The CLI under the real `horovodrun -np 2`: what is written, by whom, and that it learns."""

import itertools
import json
import re
import shutil
from pathlib import Path

import pytest

from hvd_train.distributed.checkpoint_files import checkpoint_name
from tests.conftest import FRAMEWORKS
from tests.horovodrun import STEPS, assert_no_tensorflow_banners, horovodrun, script

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(900)]


def read_metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(params=FRAMEWORKS)
def first_run(request, short_run):
    return request.param, *short_run(request.param)


def test_only_rank_zero_writes(first_run):
    _, base, _, _ = first_run
    written = sorted(p.name for p in (base / "rank0").iterdir())
    assert written[:2] == ["checkpoints", "curves.png"] and written[-2:] == [
        "metrics.jsonl",
        "summary.json",
    ]
    assert len(written) == 5 and written[2].startswith("events.out.tfevents.")  # TensorBoard's
    assert [p.name for p in (base / "rank0" / "checkpoints").iterdir()] == [checkpoint_name(1, 0)]
    assert not (base / "rank1").exists()
    assert (base / "timeline.json").exists()  # rank 0 writes it; it is not in rank 1's folder


@pytest.mark.smoke
def test_short_run_learns_far_above_chance(first_run):
    framework, base, _, _ = first_run
    summary = json.loads((base / "rank0" / "summary.json").read_text())
    assert summary["framework"] == framework and summary["world_size"] == 2
    assert summary["global_batch_size"] == 128 and summary["learning_rate"] == pytest.approx(0.002)
    assert summary["test_accuracy"] > 0.85, summary
    metrics = read_metrics(base / "rank0")
    train = [m for m in metrics if m["kind"] == "train"]
    assert [m["step"] for m in train] == [20, 40, 60]
    assert [m["samples"] for m in train] == [2560, 5120, 7680]
    assert all(m["images_per_second"] > 0 and m["step_ms"] > 0 for m in train)
    # Every step's learning rate, in order: mnist_cnn's warmup over the first half of the
    # epoch's STEPS, from 0.001 to the scaled 0.002, then its cosine decay towards zero.
    rates = [rate for m in train for rate in m["learning_rates"]]
    assert [m["learning_rate"] for m in train] == [m["learning_rates"][-1] for m in train]
    half = STEPS // 2
    assert rates[:half] == pytest.approx([0.001 + 0.001 * s / half for s in range(half)])
    assert rates[half] == pytest.approx(0.002) and len(rates) == STEPS
    assert all(b < a for a, b in itertools.pairwise(rates[half:]))
    # The step's parts: the passes, and the wait for the exchange.
    assert summary["t_comp_ms"] > 0 and summary["t_sync_ms"] > 0
    assert summary["t_comp_ms"] + summary["t_sync_ms"] < summary["step_ms"]
    assert summary["images_per_second"] == pytest.approx(
        summary["global_batch_size"] * 1000 / summary["step_ms"], rel=0.01
    )
    assert "wall time of all those steps" in summary["images_per_second_basis"]
    assert metrics[-1] == {
        "kind": "eval",
        "epoch": 1,
        "step": STEPS,
        "samples": 60000,
        "epochs": 1.0,
        "test_loss": summary["test_loss"],
        "test_accuracy": summary["test_accuracy"],
    }
    assert summary["settings"]["optimizer"] == {"name": "adam", "learning_rate": 0.001,
        "momentum": 0.0, "nesterov": False, "weight_decay": 0.0, "weight_decay_exclude": [],
        "gradient_clip_norm": 0.0}  # fmt: skip


def test_tensorboard_reads_what_metrics_jsonl_says(first_run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    _, base, _, _ = first_run
    events = EventAccumulator(str(base / "rank0"))
    events.Reload()
    tags = events.Tags()["scalars"]
    assert sorted(tags) == sorted(["train/loss", "train/learning_rate", "speed/images_per_second",
                                   "speed/step_ms", "test/loss", "test/accuracy"])  # fmt: skip
    metrics = read_metrics(base / "rank0")
    for key, tag in (("loss", "train/loss"), ("test_accuracy", "test/accuracy")):
        expected = [(m["samples"], m[key]) for m in metrics if key in m]
        logged = [(event.step, event.value) for event in events.Scalars(tag)]
        assert [step for step, _ in logged] == [step for step, _ in expected]
        assert [value for _, value in logged] == pytest.approx([v for _, v in expected], rel=1e-6)


def test_the_timeline_records_the_gradient_exchange(first_run):
    _, base, _, _ = first_run
    text = (base / "timeline.json").read_text().rstrip().rstrip(",")
    events = json.loads(text if text.endswith("]") else text + "]")  # written as it goes
    names = {e["args"]["name"] for e in events if e.get("name") == "process_name" and "args" in e
             and "name" in e["args"]}  # fmt: skip
    assert any("hvd_train.step" in name for name in names), names  # the step's group
    phases = {e.get("name") for e in events}
    assert {"NEGOTIATE_ALLREDUCE", "ALLREDUCE"} <= phases


def lines_of(output: str, rank: int) -> list[str]:
    """What `rank` printed, as horovodrun prefixes it ([1]<stdout>:...), prefix removed."""
    return [line.split(">:", 1)[1] for line in output.splitlines()
            if re.match(rf"\[{rank}\]<std(out|err)>:", line)]  # fmt: skip


def test_progress_and_log_lines_come_from_rank_zero_only(first_run):
    framework, _, _, output = first_run
    # Not a terminal (horovodrun's pipes): plain lines, each with a new record (--log-every 20).
    assert "\r" not in output
    rank_zero = lines_of(output, 0)
    progress = [line for line in rank_zero if line.startswith("epoch 1/1: step ")]
    assert [line.split(": step ")[1].split(",")[0] for line in progress] == [
        f"{step}/{STEPS}" for step in range(20, STEPS + 1, 20)
    ]
    assert all("loss " in line and "images_per_s " in line for line in progress), progress
    assert [line for line in rank_zero if line.startswith("epoch 1/1: train loss")]
    # The same filter that found rank 0's lines finds none of rank 1's.
    assert not [line for line in lines_of(output, 1) if "epoch" in line or "hvd-train" in line]
    if framework == "torch":  # nothing of TensorFlow's, not even from horovodrun
        assert "tensorflow" not in output.lower() and "cpu_feature_guard" not in output
    assert_no_tensorflow_banners(output)


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
