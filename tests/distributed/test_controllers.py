"""The recipe trains under Horovod's other controller, `horovodrun --mpi`; every other
multi-process test trains under `--gloo`."""

import json
import shutil

import pytest

from tests.conftest import FRAMEWORKS
from tests.horovodrun import horovodrun

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(900)]


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_training_runs_under_mpi(framework, mnist_dir, tmp_path):
    if shutil.which("mpirun") is None:
        pytest.skip("Open MPI is not installed here (make setup installs it where it can)")
    output = horovodrun(
        "-m", "hvd_train", "--framework", framework, "--data-dir", str(mnist_dir),
        "--output-dir", str(tmp_path), "--epochs", "1", "--limit-steps", "40",
        horovodrun_options=["--mpi"],
    )  # fmt: skip
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["test_accuracy"] > 0.8
    # Open MPI tags each line with [jobid,rank]<stream>
    assert "]<stdout>:epoch 1/1: train loss" in output.stdout
