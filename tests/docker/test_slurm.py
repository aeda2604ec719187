"""Slurm for real: the shipped batch script (docker/slurm.sbatch) on a cluster of one controller
and two compute nodes (tests/slurm.py), one rank on each node through horovodrun; a
job that `scontrol requeue` interrupts checkpoints, resumes by itself and ends with the weights
of an uninterrupted run; a script asked for more ranks than it has stops with one line."""

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from benchmarks.hosts import cannot_make_hosts
from tests.conftest import REPO
from tests.helpers import assert_same_weights, saved_weights
from tests.slurm import Cluster, cannot_run_slurm, slurm_cluster

pytestmark = [pytest.mark.clusters, pytest.mark.torch, pytest.mark.timeout(1200)]
SCRIPT = str(REPO / "docker" / "slurm.sbatch")
STEPS = 200  # per epoch: long enough for a requeue to land mid-epoch


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Iterator[Cluster]:
    reason = cannot_make_hosts() or cannot_run_slurm()
    if reason:
        pytest.skip(reason)
    with slurm_cluster(tmp_path_factory.mktemp("slurm")) as made:
        yield made


def submit(cluster: Cluster, runs: Path, *arguments: str, wait: bool = True,
           environment: dict[str, str] | None = None) -> subprocess.CompletedProcess:  # fmt: skip
    """sbatch of the shipped script from the repository (where .venv is), one task on each node,
    with ARGUMENTS for hvd-train; the run goes to RUNS/slurm-<job id>, beside its log."""
    runs.mkdir(parents=True, exist_ok=True)  # Slurm does not make the log's folder
    command = ["sbatch", "--parsable", "--nodes=2", "--ntasks-per-node=1", "--cpus-per-task=1",
               f"--output={runs}/slurm-%j.log", *(["--wait"] if wait else []), SCRIPT,
               *arguments]  # fmt: skip
    env = (
        cluster.environment
        | {
            "HVD_TRAIN_RUNS": str(runs),
            # Each node's only link is eth0; the key is the one the nodes' sshd trust.
            "HOROVODRUN_OPTIONS": f"--ssh-identity-file {cluster.hosts.key} "
            "--network-interface eth0",
            # Without fusion the order of the sums is the same in every run (as in
            # tests/distributed/test_hosts.py).
            "HOROVOD_FUSION_THRESHOLD": "0",
        }
        | (environment or {})
    )
    return subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=900)  # fmt: skip


def job_state(cluster: Cluster, job: str) -> dict[str, str]:
    shown = cluster.run("scontrol", "show", "job", job).stdout.split()
    return dict(field.split("=", 1) for field in shown if "=" in field)


@pytest.fixture(scope="module")
def uninterrupted(cluster, mnist_dir, tmp_path_factory) -> Path:
    """One epoch of mnist_cnn (STEPS steps) as a batch job, start to end."""
    runs = tmp_path_factory.mktemp("runs")
    result = submit(cluster, runs, "--data-dir", str(mnist_dir), "--epochs", "1",
                    "--limit-steps", str(STEPS))  # fmt: skip
    job = result.stdout.strip()
    assert result.returncode == 0, result.stderr + (runs / f"slurm-{job}.log").read_text()
    return runs / f"slurm-{job}"


def test_the_batch_script_trains_with_a_rank_on_each_node(cluster, mnist_dir, tmp_path):
    runs = tmp_path / "runs"
    result = submit(cluster, runs, "--data-dir", str(mnist_dir), "--epochs", "1")
    job = result.stdout.strip()
    log = (runs / f"slurm-{job}.log").read_text()
    assert result.returncode == 0, result.stderr + log
    summary = json.loads((runs / f"slurm-{job}" / "summary.json").read_text())
    assert summary["hosts"] == {"hvd-host-a": 1, "hvd-host-b": 1}
    assert summary["recipe"] == "mnist_cnn" and summary["world_size"] == 2
    assert summary["test_accuracy"] >= 0.98, summary


def test_a_requeued_job_resumes_by_itself_to_the_uninterrupted_weights(
    cluster, uninterrupted, mnist_dir, tmp_path
):
    runs = tmp_path / "runs"
    result = submit(cluster, runs, "--data-dir", str(mnist_dir), "--epochs", "1",
                    "--limit-steps", str(STEPS), "--log-every", "5", wait=False)  # fmt: skip
    job = result.stdout.strip()
    run = runs / f"slurm-{job}"
    deadline = time.monotonic() + 300
    while not ((run / "metrics.jsonl").exists() and (run / "metrics.jsonl").read_text()):
        assert time.monotonic() < deadline, (runs / f"slurm-{job}.log").read_text()
        time.sleep(0.2)
    assert cluster.run("scontrol", "requeue", job).returncode == 0  # training is under way
    # Slurm holds a requeued job for two minutes before it may start again; release it.
    requeued = time.monotonic() + 60
    while (state := job_state(cluster, job))["JobState"] != "PENDING":
        assert time.monotonic() < requeued, state
        time.sleep(0.5)
    cluster.run("scontrol", "update", f"JobId={job}", "StartTime=now")
    while (state := job_state(cluster, job))["JobState"] not in {"COMPLETED", "FAILED"}:
        assert time.monotonic() < deadline + 600, state
        time.sleep(1)
    log = (runs / f"slurm-{job}.log").read_text()
    assert state["JobState"] == "COMPLETED" and state["Restarts"] == "1", log
    assert "hvd-train: stopped by SIGTERM at step" in log, log
    assert f"hvd-train: resuming from {run}/checkpoints/epoch-0000-sample-" in log, log
    assert_same_weights(saved_weights(uninterrupted, 1), saved_weights(run, 1))


def test_more_ranks_than_the_allocation_has_is_one_line(cluster, tmp_path):
    runs = tmp_path / "runs"
    result = submit(cluster, runs, environment={"NP": "3"})
    job = result.stdout.strip()
    log = (runs / f"slurm-{job}.log").read_text()
    assert result.returncode != 0
    assert log == (
        "hvd-train: error: NP asks for 3 ranks, but the allocation has 2 tasks; ask sbatch for 3 "
        "tasks (--ntasks, or --nodes and --ntasks-per-node) or set NP to 2 or fewer\n"
    )
