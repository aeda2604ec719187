"""On a machine with an NVIDIA GPU (and Horovod built with NCCL, as `make setup` builds it where
nvcc is): `doctor` sees the GPU and NCCL, and the ResNet-18 recipe trains on it under each
framework. Skipped elsewhere, with the reason; nothing GPU is called tested until this ran."""

import json
import shutil
import subprocess
import sys

import pytest

from tests.conftest import FRAMEWORKS

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(shutil.which("nvidia-smi") is None, reason="no NVIDIA GPU here"),
]


def hvd_train(*arguments: str) -> str:
    command = [sys.executable, "-m", "hvd_train", *arguments]
    return subprocess.run(command, capture_output=True, text=True, check=True, timeout=900).stdout


def test_doctor_sees_the_gpu_and_nccl():
    report = hvd_train("doctor")
    assert "NCCL" in report and "GPU 0" in report, report


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_resnet18_trains_on_the_gpu(framework):
    figures = json.loads(
        hvd_train("bench", "--recipe", "resnet18", "--framework", framework, "--steps", "30",
                  "--json").splitlines()[-1]
    )  # fmt: skip
    print(f"resnet18 on the GPU under {framework}: {figures}")
    # A GPU trains ResNet-18 at thousands of images/s; two CPU cores manage about fifty.
    assert figures["images_per_second"] > 1000, figures
