"""Faults under the real `horovodrun -np 2`: a job killed with SIGKILL resumes to exactly the
weights of an uninterrupted run, and a dead worker ends the job instead of hanging it."""

import json
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
from tests.conftest import FRAMEWORKS, REPO
from tests.multiprocess.conftest import HOROVODRUN, horovodrun

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow, pytest.mark.timeout(900)]
STEPS = 40  # per epoch; two epochs, a checkpoint every 5 steps
EXAMPLES = REPO / "recipes" / "examples"
# The neutral recipe under both frameworks, and Python recipes: a torch module, and a Keras
# model (with batchnorm and dropout) under each framework.
RESUMABLE = [
    pytest.param("mnist_cnn", "torch", marks=pytest.mark.torch),
    pytest.param("mnist_cnn", "tensorflow", marks=pytest.mark.tensorflow),
    pytest.param(str(EXAMPLES / "mnist_resnet_torch.py"), "torch", marks=pytest.mark.torch),
    pytest.param(str(EXAMPLES / "mnist_resnet_keras.py"), "torch", marks=pytest.mark.torch),
    pytest.param(
        str(EXAMPLES / "mnist_resnet_keras.py"), "tensorflow", marks=pytest.mark.tensorflow
    ),
]


def start(*arguments: str) -> subprocess.Popen:
    command = [str(HOROVODRUN), "-np", "2", "--gloo", sys.executable, "-m", "hvd_train", *arguments]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def kill_job(job: subprocess.Popen, sig: int = signal.SIGKILL) -> None:
    """Kills horovodrun and every worker it started."""
    processes = [*psutil.Process(job.pid).children(recursive=True), psutil.Process(job.pid)]
    for process in processes:
        process.send_signal(sig)
    job.wait(timeout=60)


def wait_for(condition, job: subprocess.Popen, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert job.poll() is None, f"the job ended early:\n{job.stdout.read()}"
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def final_weights(run: Path) -> dict[str, np.ndarray]:
    return load_file(run / "checkpoints" / checkpoint_name(2, 0) / "model.safetensors")


@pytest.mark.parametrize(("recipe", "framework"), RESUMABLE, ids=lambda p: Path(p).stem)
def test_killed_and_resumed_run_matches_the_uninterrupted_one(
    recipe, framework, mnist_dir, tmp_path
):
    arguments = ["--recipe", recipe, "--framework", framework, "--data-dir", str(mnist_dir),
                 "--epochs", "2", "--limit-steps", str(STEPS),
                 "--checkpoint-every", "5"]  # fmt: skip
    horovodrun("-m", "hvd_train", *arguments, "--output-dir", str(tmp_path / "straight"))

    killed = tmp_path / "killed"
    job = start(*arguments, "--output-dir", str(killed))
    halfway = killed / "checkpoints" / checkpoint_name(1, 0)
    wait_for(halfway.exists, job)
    kill_job(job)
    assert not (killed / "summary.json").exists(), "the job finished before it was killed"
    # Damage the newest checkpoint too: resuming must notice and fall back to the one before.
    newest = checkpoints(killed / "checkpoints")[-1]
    model = newest / "model.safetensors"
    model.write_bytes(model.read_bytes()[:1000])
    resumed_output = horovodrun(
        "-m", "hvd_train", *arguments, "--output-dir", str(killed), "--resume"
    )
    assert f"checkpoint {newest} is corrupt (model.safetensors fails its checksum)" in (
        resumed_output.stdout + resumed_output.stderr
    )

    straight, resumed = final_weights(tmp_path / "straight"), final_weights(killed)
    assert straight.keys() == resumed.keys() and len(straight) >= 8
    for name in straight:
        assert np.array_equal(straight[name], resumed[name]), name


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_a_dead_worker_ends_the_job_within_a_minute(framework, mnist_dir, tmp_path):
    job = start(
        "--framework", framework, "--data-dir", str(mnist_dir), "--output-dir", str(tmp_path)
    )
    wait_for((tmp_path / "metrics.jsonl").exists, job)
    rank_one = next(
        p for p in psutil.Process(job.pid).children(recursive=True)
        if p.environ().get("HOROVOD_RANK") == "1" and "hvd_train" in " ".join(p.cmdline())
    )  # fmt: skip
    rank_one.kill()
    killed_at = time.monotonic()
    output, _ = job.communicate(timeout=120)
    assert time.monotonic() - killed_at < 60
    assert job.returncode != 0
    assert "Process name: 1" in output and "Exit code: 137" in output
    assert "hvd-train: error: lost contact with another rank" in output


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_ranks_that_disagree_stop_at_once_naming_the_difference(framework, mnist_dir, tmp_path):
    launcher = tmp_path / "disagree.py"
    launcher.write_text(
        "import os, sys\nfrom hvd_train.cli import main\n"
        "extra = ['--lr', '0.5'] if os.environ['HOROVOD_RANK'] == '1' else []\n"
        "sys.exit(main(sys.argv[1:] + extra))\n"
    )
    arguments = [
        "--framework",
        framework,
        "--data-dir",
        str(mnist_dir),
        "--output-dir",
        str(tmp_path),
    ]
    command = [str(HOROVODRUN), "-np", "2", "--gloo", sys.executable, str(launcher), *arguments]
    started = time.monotonic()
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert time.monotonic() - started < 60
    assert result.returncode != 0
    assert (
        "[0]<stderr>:hvd-train: error: rank 1 disagrees with rank 0 on the recipe"
        in result.stdout + result.stderr
    )
    assert not (tmp_path / "checkpoints").exists()


@pytest.mark.torch
@pytest.mark.parametrize(
    ("recipe", "epochs", "accuracy"),
    [("mnist_cnn", 4, 0.99), (str(EXAMPLES / "mnist_resnet_torch.py"), 1, 0.98)],
    ids=["mnist_cnn", "python-recipe"],
)
def test_elastic_job_goes_on_without_a_killed_worker_and_reaches_the_recipes_accuracy(
    recipe, epochs, accuracy, mnist_dir, tmp_path
):
    # Two "hosts" that are both this machine: Horovod blacklists the host of a failed worker,
    # so the survivor must be on another one.
    discover = tmp_path / "discover.sh"
    discover.write_text("#!/bin/sh\necho localhost:1\necho 127.0.0.1:1\n")
    discover.chmod(0o755)
    output_dir = tmp_path / "run"
    elastic = ["-np", "2", "--min-np", "1", "--max-np", "2", "--gloo",
               "--host-discovery-script", str(discover)]  # fmt: skip
    arguments = ["--elastic", "--recipe", recipe, "--data-dir", str(mnist_dir),
                 "--output-dir", str(output_dir)]  # fmt: skip
    command = [str(HOROVODRUN), *elastic, sys.executable, "-m", "hvd_train", *arguments]
    job = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    wait_for((output_dir / "metrics.jsonl").exists, job)  # 50 steps trained, state committed
    workers = [
        p for p in psutil.Process(job.pid).children(recursive=True) if "HOROVOD_RANK" in p.environ()
    ]
    victim = next(p for p in workers if p.environ()["HOROVOD_HOSTNAME"] == "127.0.0.1")
    victim.kill()
    output, _ = job.communicate(timeout=900)
    assert job.returncode == 0, output
    summary = json.loads((output_dir / "summary.json").read_text())
    assert summary["world_size"] == 1 and summary["epochs"] == epochs
    assert summary["learning_rate"] == pytest.approx(0.002 if epochs == 1 else 0.001)
    assert summary["test_accuracy"] >= accuracy, summary
