"""Horovod's own TensorFlow API on Keras 3 (patch 16-keras3-variables): its MNIST example as it
is, and each call against a one-process reference, under the real horovodrun."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.horovodrun import script

HOROVODRUN = Path(sys.executable).parent / "horovodrun"
EXAMPLE = REPO.parent / "shared" / "horovod-v0.28.1-examples" / "tensorflow2_mnist.py"
STEPS = 60  # of the example's 5,000 a rank at np=2

pytestmark = [pytest.mark.multiprocess, pytest.mark.tensorflow, pytest.mark.slow]


def two_ranks(*arguments: str, cwd: Path | None = None) -> str:
    command = [str(HOROVODRUN), "-np", "2", "--gloo", sys.executable, *arguments]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=cwd)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    return output


def test_each_api_averages_as_one_process_does():
    output = two_ranks(script("horovod/keras3_apis.py"))
    assert sorted(re.findall(r"\[\d\]<stdout>:OK", output)) == ["[0]<stdout>:OK", "[1]<stdout>:OK"]


@pytest.mark.skipif(not EXAMPLE.is_file(), reason=f"Horovod's examples are not at {EXAMPLE}")
def test_horovods_own_tensorflow2_mnist_runs_and_learns(mnist_dir, tmp_path):
    output = two_ranks(script("horovod/horovod_example.py"), str(EXAMPLE), str(STEPS),
                       str(mnist_dir), cwd=tmp_path)  # fmt: skip
    losses = [float(v) for v in re.findall(r"\[0\]<stdout>:Step #\d+\tLoss: ([\d.]+)", output)]
    assert len(losses) == STEPS // 10 and losses[-1] < losses[0] / 2, output
    assert list(tmp_path.glob("checkpoints-*.index")), "rank 0 saved no checkpoint"
