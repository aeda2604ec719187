"""Stopping well under the real `horovodrun -np 2`: on a signal (checkpoint, then resume to the
uninterrupted run's weights), on numbers that turn non-finite, and on writes that fail; each
with one line, a non-zero exit, and nothing saved lost or half-written."""

import json
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
from safetensors.numpy import load_file

from hvd_train.distributed.checkpoint_files import checkpoint_name, checkpoints
from tests.conftest import FRAMEWORKS
from tests.helpers import assert_same_weights, evaluation, saved_weights
from tests.horovodrun import (
    HOROVODRUN,
    failed_job,
    horovodrun,
    rank_children,
    script,
    start,
    trainings,
    wait_for,
)

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow, pytest.mark.timeout(900)]
DIVERGING = script("diverging.py")
EVENTS_RECIPE = script("events_recipe.py")


def records(run: Path) -> list[dict]:
    path = run / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def rank_processes(job: subprocess.Popen) -> list[psutil.Process]:
    return [p for p, _, command in rank_children(job) if "hvd_train" in command]


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_a_signal_checkpoints_at_the_next_step_and_resume_finishes_the_same(
    framework, mnist_dir, tmp_path
):
    # 80 steps an epoch: the signal, sent once the first record (step 5) shows, must land
    # before the last step (40 did not always, in CI, once TensorFlow's steps got faster).
    arguments = ["--framework", framework, "--data-dir", str(mnist_dir), "--epochs", "2",
                 "--limit-steps", "80", "--log-every", "5"]  # fmt: skip
    horovodrun("-m", "hvd_train", *arguments, "--output-dir", str(tmp_path / "straight"))
    final = checkpoint_name(2, 0)
    expected = saved_weights(tmp_path / "straight", 2)
    # SIGTERM to horovodrun (it passes it on), and SIGINT to the ranks themselves (as Slurm and
    # Kubernetes signal every process).
    for target, sig in (("horovodrun", signal.SIGTERM), ("ranks", signal.SIGINT)):
        run = tmp_path / target
        job = start(*arguments, "--output-dir", str(run))
        wait_for(lambda run=run: records(run), job)  # training is under way
        for process in [psutil.Process(job.pid)] if target == "horovodrun" else rank_processes(job):
            process.send_signal(sig)
        signalled = time.monotonic()
        output, _ = job.communicate(timeout=60)
        assert time.monotonic() - signalled < 30
        assert job.returncode != 0, (target, output)
        stopped = [line for line in output.splitlines() if "hvd-train: stopped by" in line]
        assert len(stopped) == 1 and stopped[0].startswith("[0]<stdout>:"), output
        assert f"stopped by {sig.name} at step" in stopped[0]
        assert stopped[0].endswith(f"continue with: hvd-train --resume --output-dir {run}")
        saved = checkpoints(run / "checkpoints")
        assert saved and saved[-1].name != final and not (run / "summary.json").exists()
    runs = [tmp_path / "horovodrun", tmp_path / "ranks"]
    trainings(*[["--resume", "--output-dir", str(run), "--data-dir", str(mnist_dir)]
                for run in runs])  # fmt: skip
    for run in runs:
        assert_same_weights(expected, saved_weights(run, 2))


def error_line(output: str) -> str:
    """The job's one error line, from rank 0: every rank stops alike, and says so once. No
    traceback, neither a rank's nor horovodrun's."""
    assert "Traceback" not in output, output
    lines = [line for line in output.splitlines() if "hvd-train: error:" in line]
    assert [line.split(":", 1)[0] for line in lines] == ["[0]<stderr>"], output
    return lines[0].split(":", 1)[1]


def assert_all_finite(run: Path) -> list[Path]:
    saved = checkpoints(run / "checkpoints")
    for path in saved:
        weights = load_file(path / "model.safetensors")
        assert all(np.isfinite(array).all() for array in weights.values()), path
    return saved


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_a_loss_that_turns_nan_stops_every_rank_before_saving_it(framework, tmp_path):
    run = tmp_path / "run"
    line = failed_job("--recipe", DIVERGING, "--framework", framework, "--limit-steps", "40",
                      "--checkpoint-every", "5", "--output-dir", str(run))  # fmt: skip
    assert line == (
        "hvd-train: error: the loss became nan at step 13 of epoch 1, and training stopped "
        "before saving anything after it; lower the learning rate (--lr) or clip the gradients "
        "(--set optimizer.gradient_clip_norm=1.0), and continue from the newest checkpoint "
        "with --resume"
    )
    saved = assert_all_finite(run)
    assert [path.name for path in saved] == [
        checkpoint_name(0, 5 * 64),
        checkpoint_name(0, 10 * 64),
    ]


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_a_bad_recipe_ends_the_job_with_one_line(framework):
    line = failed_job("--recipe", "nope", "--framework", framework)
    assert line.startswith("hvd-train: error: unknown recipe 'nope'; use one of "), line


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_a_missing_data_file_ends_the_job_with_one_line(framework, mnist_dir, tmp_path):
    data = tmp_path / "data"
    shutil.copytree(mnist_dir, data)
    (data / "t10k-labels-idx1-ubyte.gz").unlink()
    line = failed_job("--framework", framework, "--data-dir", str(data),
                      "--output-dir", str(tmp_path / "run"))  # fmt: skip
    assert line == (
        f"hvd-train: error: rank 0: data directory {data} lacks t10k-labels-idx1-ubyte.gz; add "
        "the original MNIST files or leave out --data-dir to use the cache"
    )


@pytest.mark.torch
def test_gradients_that_turn_nan_stop_every_rank_before_saving_them(tmp_path):
    run = tmp_path / "run"
    line = failed_job("--recipe", f"{DIVERGING}:nan_gradients", "--limit-steps", "40",
                      "--checkpoint-every", "5", "--output-dir", str(run))  # fmt: skip
    assert "error: the gradient norm became nan at step 13 of epoch 1" in line
    assert len(assert_all_finite(run)) == 2


def test_a_callback_on_one_rank_stops_every_rank_at_the_same_step(tmp_path, monkeypatch):
    # Rank 1 alone asks for a stop at step 2: it travels with step 3's gradients, and both
    # ranks end there, with a checkpoint, the evaluations and their events alike.
    monkeypatch.setenv("EVENTS", str(tmp_path / "events"))
    monkeypatch.setenv("STOP", "on_step_end:2:1")
    run = tmp_path / "run"
    horovodrun("-m", "hvd_train", "--recipe", EVENTS_RECIPE, "--output-dir", str(run),
               "--set", "data.validation_fraction=0.25")  # fmt: skip
    seen = [[json.loads(line) for line in (tmp_path / f"events.{rank}").read_text().splitlines()]
            for rank in (0, 1)]  # fmt: skip
    assert seen[0] == seen[1]
    assert [(e["event"], e["step"]) for e in seen[0][-5:]] == [
        ("on_evaluate", 3), ("on_checkpoint", 3), ("on_epoch_end", 3), ("on_evaluate", 3),
        ("on_train_end", 3)
    ]  # fmt: skip
    assert [p.name for p in checkpoints(run / "checkpoints")] == [checkpoint_name(0, 3 * 64)]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["stopped_early"] is True and "val_loss" in summary
    # The test set's figures at the end, reduced over two ranks, are one process's.
    alone = evaluation(run, "--framework", "torch")
    assert alone["test_loss"] == pytest.approx(summary["test_loss"], rel=1e-6)
    # Rank 1's callback raises at step 2: one line naming it, and the same checkpoint.
    monkeypatch.delenv("STOP")
    monkeypatch.setenv("RAISE", "on_step_end:2:1")
    run = tmp_path / "raised"
    line = failed_job("--recipe", EVENTS_RECIPE, "--output-dir", str(run))
    assert line.endswith(
        "hvd-train: error: rank 1: callback Events raised ValueError in on_step_end: asked to "
        "raise at step 2; training stopped at step 3 of epoch 1 after saving a checkpoint; fix "
        f"the callback and continue with: hvd-train --resume --output-dir {run}"
    )
    assert [p.name for p in checkpoints(run / "checkpoints")] == [checkpoint_name(0, 3 * 64)]


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_replicas_that_diverge_stop_the_job_naming_the_tensor(framework, tmp_path):
    # Rank 1's model nudges one weight at every step behind Horovod's back: the check at the
    # epoch's end must name it, before that epoch is saved.
    run = tmp_path / "run"
    line = failed_job("--recipe", f"{DIVERGING}:split_replicas", "--framework", framework,
                      "--limit-steps", "20", "--checkpoint-every", "10", "--output-dir", str(run),
                      code=1)  # fmt: skip
    assert re.search(
        r"hvd-train: error: at the end of epoch 1, rank 1 holds another weight\.\S+ than rank 0 "
        r"\(\d+ of \d+ tensors differ\): the replicas diverged, which is a bug",
        line,
    ), line
    assert [path.name for path in checkpoints(run / "checkpoints")] == [checkpoint_name(0, 640)]


def unshare_works() -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "--mount", "mount", "-t", "tmpfs", "tmpfs", "/mnt"],
                           capture_output=True)  # fmt: skip
    return probe.returncode == 0


@pytest.mark.skipif(not unshare_works(), reason="needs root and mount namespaces (unshare)")
@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_a_full_disk_is_one_line_and_keeps_the_saved_checkpoint(framework, mnist_dir, tmp_path):
    # The run directory is a 4 MB file system: one checkpoint (2.2 MB) fits, the second not.
    run = tmp_path / "run"
    run.mkdir()
    train = [str(HOROVODRUN), "-np", "2", "--gloo", sys.executable, "-m", "hvd_train",
             "--framework", framework, "--data-dir", str(mnist_dir), "--limit-steps", "40",
             "--checkpoint-every", "5", "--output-dir", str(run)]  # fmt: skip
    check = [sys.executable, "-m", "hvd_train", "eval", "--checkpoint", str(run), "--json",
             "--framework", framework, "--data-dir", str(mnist_dir)]  # fmt: skip
    shell = (
        f"mount -t tmpfs -o size=4m tmpfs {run} && {{ {' '.join(train)}; echo EXIT=$?; "
        f"ls -A {run}/checkpoints; {' '.join(check)}; }}"
    )
    result = subprocess.run(["unshare", "--mount", "sh", "-c", shell], capture_output=True,
                            text=True, timeout=600)  # fmt: skip
    output = result.stdout + result.stderr
    assert "EXIT=0" not in output and "EXIT=" in output, output
    line = error_line(output)
    assert (
        f"hvd-train: error: cannot write checkpoint {run}/checkpoints/{checkpoint_name(0, 1280)}"
        in line
    )
    assert "(No space left on device" in line and "the earlier checkpoints are intact" in line
    listing = result.stdout.split("EXIT=", 1)[1].splitlines()[1:]
    assert listing[:-1] == [checkpoint_name(0, 640)]  # the first, and nothing half-written
    assert json.loads(listing[-1])["checkpoint"].endswith(checkpoint_name(0, 640))


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_a_vanished_output_directory_is_one_line(framework, mnist_dir, tmp_path):
    run = tmp_path / "run"
    job = start("--framework", framework, "--data-dir", str(mnist_dir), "--log-every", "5",
                "--output-dir", str(run))  # fmt: skip
    wait_for(lambda: records(run), job)
    # Moved away at once, then deleted: deleting in place races with the job's writes into it.
    run.rename(tmp_path / "gone")
    shutil.rmtree(tmp_path / "gone", ignore_errors=True)
    output, _ = job.communicate(timeout=120)
    assert job.returncode != 0
    assert f"cannot write {run}/metrics.jsonl (No such file or directory)" in error_line(output)
