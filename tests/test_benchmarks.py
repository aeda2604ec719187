"""The benchmarks' one-process baselines run: a benchmark that stops at its first baseline
measures nothing (benchmarks.run did, on the torch plain loop, until 2026-11-27)."""

import json
import os
import subprocess
import sys

import pytest

from benchmarks.run import ROOT


@pytest.mark.parametrize(
    "baseline",
    [
        pytest.param("benchmarks.torch_baselines", marks=pytest.mark.torch),
        pytest.param("benchmarks.tf_baselines", marks=pytest.mark.tensorflow),
    ],
)
def test_the_plain_loop_baselines_report_their_speed(baseline, mnist_dir):
    env = {**os.environ, "HVD_TRAIN_DATA_DIR": str(mnist_dir), "THREADS": "1",
           "PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "3"}  # fmt: skip
    command = [sys.executable, "-m", baseline, "plain", "mnist_cnn", "2"]
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    [line] = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert json.loads(line.removeprefix("RESULT "))["images_per_second"] > 0


@pytest.mark.slow
@pytest.mark.parametrize(
    "framework",
    [pytest.param("torch", marks=pytest.mark.torch),
     pytest.param("tensorflow", marks=pytest.mark.tensorflow)],
)  # fmt: skip
@pytest.mark.parametrize("system", ["loop", "trainer", "horovod"])
def test_the_own_loop_benchmarks_systems_report_their_speed(system, framework, mnist_dir):
    """benchmarks.own_loop's loop on the layer, the trainer and the raw Horovod loop, each in
    one process (horovodrun starts two in the benchmark)."""
    env = {**os.environ, "HVD_TRAIN_DATA_DIR": str(mnist_dir), "PYTHONPATH": str(ROOT),
           "TF_CPP_MIN_LOG_LEVEL": "3"}  # fmt: skip
    command = [sys.executable, "-m", "benchmarks.own_loop", "rank", system, framework,
               "mnist_cnn", "2"]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    [line] = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert json.loads(line.removeprefix("RESULT "))["images_per_second"] > 0
