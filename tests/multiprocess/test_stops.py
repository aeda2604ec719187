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

from hvd_train.checkpoint import checkpoint_name, checkpoints
from tests.conftest import FRAMEWORKS
from tests.multiprocess.conftest import HERE, HOROVODRUN, horovodrun, start, wait_for

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow, pytest.mark.timeout(900)]
DIVERGING = str(HERE / "diverging.py")


def records(run: Path) -> list[dict]:
    path = run / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def rank_processes(job: subprocess.Popen) -> list[psutil.Process]:
    children = psutil.Process(job.pid).children(recursive=True)
    return [p for p in children if "HOROVOD_RANK" in p.environ() and "hvd_train" in p.cmdline()]


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
    expected = load_file(tmp_path / "straight" / "checkpoints" / final / "model.safetensors")
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
        horovodrun("-m", "hvd_train", "--resume", "--output-dir", str(run),
                   "--data-dir", str(mnist_dir))  # fmt: skip
        resumed = load_file(run / "checkpoints" / final / "model.safetensors")
        assert expected.keys() == resumed.keys()
        for name in expected:
            assert np.array_equal(expected[name], resumed[name]), (target, name)


def run_to_failure(*arguments: str) -> subprocess.CompletedProcess:
    command = [str(HOROVODRUN), "-np", "2", "--gloo", sys.executable, "-m", "hvd_train",
               *arguments]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert result.returncode != 0
    return result


def error_lines(output: str) -> list[str]:
    """The ranks' error lines; no rank may show a traceback (horovodrun's own, which reports
    that a rank failed, is not theirs)."""
    assert not re.search(r"^\[\d+\]<std\w+>:Traceback", output, re.MULTILINE), output
    lines = [line for line in output.splitlines() if "hvd-train: error:" in line]
    assert sorted(line.split(":", 1)[0] for line in lines) == ["[0]<stderr>", "[1]<stderr>"]
    return [line.split(":", 1)[1] for line in lines]  # one each, from every rank


def assert_all_finite(run: Path) -> list[Path]:
    saved = checkpoints(run / "checkpoints")
    for path in saved:
        weights = load_file(path / "model.safetensors")
        assert all(np.isfinite(array).all() for array in weights.values()), path
    return saved


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_a_loss_that_turns_nan_stops_every_rank_before_saving_it(framework, tmp_path):
    run = tmp_path / "run"
    result = run_to_failure("--recipe", DIVERGING, "--framework", framework, "--limit-steps",
                            "40", "--checkpoint-every", "5", "--output-dir", str(run))  # fmt: skip
    lines = error_lines(result.stdout + result.stderr)
    assert lines[0] == lines[1] and lines[0].endswith(
        "hvd-train: error: the loss became nan at step 13 of epoch 1, and training stopped "
        "before saving anything after it; lower the learning rate (--lr) or clip the gradients "
        "(--set optimizer.gradient_clip_norm=1.0), and continue from the newest checkpoint "
        "with --resume"
    ), lines
    saved = assert_all_finite(run)
    assert [path.name for path in saved] == [
        checkpoint_name(0, 5 * 64),
        checkpoint_name(0, 10 * 64),
    ]


@pytest.mark.torch
def test_gradients_that_turn_nan_stop_every_rank_before_saving_them(tmp_path):
    run = tmp_path / "run"
    result = run_to_failure("--recipe", f"{DIVERGING}:nan_gradients", "--limit-steps", "40",
                            "--checkpoint-every", "5", "--output-dir", str(run))  # fmt: skip
    lines = error_lines(result.stdout + result.stderr)
    assert (
        len(lines) == 2 and "error: the gradient norm became nan at step 13 of epoch 1" in lines[0]
    )
    assert len(assert_all_finite(run)) == 2


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_replicas_that_diverge_stop_the_job_naming_the_tensor(framework, tmp_path):
    # Rank 1's model nudges one weight at every step behind Horovod's back: the check at the
    # epoch's end must name it, before that epoch is saved.
    run = tmp_path / "run"
    result = run_to_failure("--recipe", f"{DIVERGING}:split_replicas", "--framework", framework,
                            "--limit-steps", "20", "--checkpoint-every", "10",
                            "--output-dir", str(run))  # fmt: skip
    output = result.stdout + result.stderr
    assert not re.search(r"^\[\d+\]<std\w+>:Traceback", output, re.MULTILINE), output
    # Every rank finds the same; the first to exit may end the other before it says so.
    lines = {line.split(":", 1)[1] for line in output.splitlines() if "hvd-train: error:" in line}
    assert len(lines) == 1, output
    assert re.search(
        r"hvd-train: error: after epoch 1, rank 1 holds another weight\.\S+ than rank 0 "
        r"\(\d+ of \d+ tensors differ\): the replicas diverged, which is a bug",
        *lines,
    ), lines
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
    lines = error_lines(output)
    assert (
        f"hvd-train: error: cannot write checkpoint {run}/checkpoints/{checkpoint_name(0, 1280)}"
        in lines[0]
    )
    assert (
        "(No space left on device" in lines[0] and "the earlier checkpoints are intact" in lines[0]
    )
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
    lines = error_lines(output)
    assert f"cannot write {run}/metrics.jsonl (No such file or directory)" in lines[0]
