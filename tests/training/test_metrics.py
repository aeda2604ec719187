"""metrics.py: rank 0's records, in metrics.jsonl and TensorBoard, and what a failed write or a
run going back to an earlier point does to them."""

import json
import subprocess
import sys

import pytest

from hvd_train.errors import UsageError
from hvd_train.training.metrics import MetricsWriter, write_summary


def records(folder):
    return [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]


def writer(folder, enabled=True) -> MetricsWriter:
    metrics = MetricsWriter(folder, train_size=1000)
    metrics.enabled = enabled
    return metrics


def test_records_carry_samples_and_epochs_and_reach_tensorboard(tmp_path):
    metrics = writer(tmp_path)
    metrics.train(1, 10, 640, 0.5, [0.0005, 0.001], 1234.56, 7.891)
    metrics.eval(1, 16, 1000, {"test_loss": 0.25, "test_accuracy": 0.9, "test_mse": 0.5})
    metrics.close()
    (tmp_path / "val").mkdir()
    validation = writer(tmp_path / "val")
    validation.eval(1, 8, 500, {"val_loss": 0.5})
    validation.close()
    assert records(tmp_path) == [
        {"kind": "train", "epoch": 1, "step": 10, "samples": 640, "loss": 0.5,
         "learning_rate": 0.001, "learning_rates": [0.0005, 0.001], "images_per_second": 1234.6,
         "step_ms": 7.89, "epochs": 0.64},
        {"kind": "eval", "epoch": 1, "step": 16, "samples": 1000, "test_loss": 0.25,
         "test_accuracy": 0.9, "test_mse": 0.5, "epochs": 1.0},
    ]  # fmt: skip
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tmp_path))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("test/accuracy")] == [
        (1000, pytest.approx(0.9))
    ]
    assert [(e.step, e.value) for e in events.Scalars("test/mse")] == [(1000, 0.5)]
    events = EventAccumulator(str(tmp_path / "val"))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("val/loss")] == [(500, 0.5)]


def test_only_the_writing_rank_writes(tmp_path):
    writer(tmp_path, enabled=False).train(1, 1, 64, 0.5, [0.001], 1.0, 1.0)
    assert not (tmp_path / "metrics.jsonl").exists()


def test_going_back_drops_the_records_after_that_point(tmp_path):
    metrics = writer(tmp_path)
    for samples in (100, 200, 300):
        metrics.train(1, samples // 100, samples, 0.5, [0.001], 1.0, 1.0)
    metrics.keep_until(200)
    metrics.train(1, 3, 300, 0.4, [0.001], 1.0, 1.0)  # recorded anew
    metrics.close()
    assert [(r["samples"], r["loss"]) for r in records(tmp_path)] == [
        (100, 0.5), (200, 0.5), (300, 0.4)
    ]  # fmt: skip


def test_a_failed_write_is_kept_as_the_failure_and_stops_recording(tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    metrics = writer(folder)
    folder.rmdir()  # the folder went away under the run
    metrics.train(1, 1, 64, 0.5, [0.001], 1.0, 1.0)
    assert metrics.failure.startswith(f"cannot write {folder}/metrics.jsonl (No such file")
    folder.mkdir()
    metrics.train(1, 2, 128, 0.5, [0.001], 1.0, 1.0)  # the run stops at the next step anyway
    assert not (folder / "metrics.jsonl").exists()


def test_an_unwritable_summary_is_one_usage_error(tmp_path):
    write_summary(tmp_path, {"test_accuracy": 0.99})
    assert json.loads((tmp_path / "summary.json").read_text()) == {"test_accuracy": 0.99}
    with pytest.raises(UsageError, match=r"cannot write .*/gone/summary.json \(No such file"):
        write_summary(tmp_path / "gone", {})


def test_recording_loads_no_torch_where_the_run_has_none(tmp_path):
    # A TensorFlow run's rank 0: tensorboardX would import torch only to accept its tensors.
    script = (
        "import sys; from pathlib import Path\n"
        "from hvd_train.training.metrics import MetricsWriter\n"
        f"metrics = MetricsWriter(Path({str(tmp_path)!r}), train_size=1000)\n"
        "metrics.enabled = True\n"
        "metrics.train(1, 10, 640, 0.5, [0.001], 1234.56, 7.891)\n"
        "metrics.close()\n"
        "print('torch' in sys.modules)\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            timeout=60)  # fmt: skip
    assert result.stdout.split() == ["False"], result.stdout + result.stderr
    assert list(tmp_path.glob("events.out.tfevents.*"))
