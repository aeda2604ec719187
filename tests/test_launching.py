"""Ray as a launcher: `hvd-train launch --backend ray` (hvd_train.launch(..., backend="ray"))
starts the ranks as Ray actors through Horovod's RayExecutor on a local Ray cluster, and they
train exactly as the ranks horovodrun starts do."""

import os
import subprocess
import sys

import pytest

from tests.helpers import assert_same_weights, saved_weights
from tests.horovodrun import TIMEOUT, horovodrun

pytestmark = [pytest.mark.clusters, pytest.mark.torch, pytest.mark.timeout(900)]
# Without fusion the order of the sums does not depend on which gradients share a buffer.
EXACT = {"HOROVOD_FUSION_THRESHOLD": "0"}


def launch_on_ray(*arguments: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "hvd_train", "launch", "--backend", "ray", "-np", "2",
               *arguments]  # fmt: skip
    env = os.environ | EXACT
    return subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT, env=env)


def test_ray_actors_train_the_weights_horovodrun_trains(mnist_dir, tmp_path, monkeypatch):
    arguments = ["--recipe", "mnist_cnn", "--framework", "torch", "--data-dir", str(mnist_dir),
                 "--epochs", "1", "--limit-steps", "60", "--seed", "7"]  # fmt: skip
    on_ray = launch_on_ray(*arguments, "--output-dir", str(tmp_path / "ray"))
    assert on_ray.returncode == 0, on_ray.stdout + on_ray.stderr
    assert "on 2 ranks (ray): test loss " in on_ray.stdout, on_ray.stdout
    for name, value in EXACT.items():
        monkeypatch.setenv(name, value)
    horovodrun("-m", "hvd_train", *arguments, "--output-dir", str(tmp_path / "horovodrun"))
    assert_same_weights(
        saved_weights(tmp_path / "horovodrun", 1), saved_weights(tmp_path / "ray", 1)
    )


def test_a_mistake_found_in_the_ray_actors_is_one_line(tmp_path):
    result = launch_on_ray("--data-dir", str(tmp_path / "nowhere"), "--output-dir",
                           str(tmp_path / "run"))  # fmt: skip
    assert result.returncode == 2, result.stdout + result.stderr
    errors = [line for line in result.stderr.splitlines() if "hvd-train: error:" in line]
    assert errors == [
        f"hvd-train: error: rank 0: data directory {tmp_path}/nowhere does not exist; fix "
        "--data-dir or HVD_TRAIN_DATA_DIR"
    ], result.stderr
