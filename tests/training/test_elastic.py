"""Elastic training (torch) under horovodrun's elastic launcher: workers leave and join, the
job goes on, and every replica holds the same weights and optimizer state (the trainer checks
that bit for bit at every epoch's end, and stops the job if they differ)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.horovodrun import HOROVODRUN, background, rank_children, wait_for

pytestmark = [
    pytest.mark.multiprocess,
    pytest.mark.slow,
    pytest.mark.torch,
    pytest.mark.timeout(900),
]
EXAMPLES = REPO / "recipes" / "examples"


def elastic_job(tmp_path: Path, np: int, *arguments: str) -> tuple[subprocess.Popen, Path]:
    """An elastic job whose hosts are listed in `hosts` beside it (the discovery script prints
    that file). Two "hosts" that are both this machine: Horovod blacklists the host of a failed
    worker, so a survivor must be on another one."""
    hosts = tmp_path / "hosts"
    discover = tmp_path / "discover.sh"
    discover.write_text(f"#!/bin/sh\ncat {hosts}\n")
    discover.chmod(0o755)
    output_dir = tmp_path / "run"
    elastic = ["-np", str(np), "--min-np", "1", "--max-np", "2", "--gloo",
               "--host-discovery-script", str(discover)]  # fmt: skip
    command = [str(HOROVODRUN), *elastic, sys.executable, "-m", "hvd_train", "--elastic",
               "--output-dir", str(output_dir), *arguments]  # fmt: skip
    # Both "hosts" share this machine's cores: one thread each, or they oversubscribe them.
    environment = os.environ | {"HVD_TRAIN_THREADS": "1"}
    job = background(command, env=environment)
    return job, output_dir


def train_records(run: Path) -> list[dict]:
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [r for r in records if r["kind"] == "train"]


def test_the_job_goes_on_without_its_killed_rank_0_and_reaches_the_recipes_accuracy(
    mnist_dir, tmp_path
):
    # A Python recipe (the TOML recipes share the same path), one epoch: 98% is its bar.
    recipe = str(EXAMPLES / "mnist_resnet_torch.py")
    (tmp_path / "hosts").write_text("localhost:1\n127.0.0.1:1\n")
    job, output_dir = elastic_job(tmp_path, 2, "--recipe", recipe, "--data-dir", str(mnist_dir))
    wait_for((output_dir / "metrics.jsonl").exists, job)  # 50 steps trained, state committed
    # Rank 0, the writer: the survivor must take over its records, checkpoints and summary.
    victim = next(p for p, rank, _ in rank_children(job) if rank == "0")
    victim.kill()
    output, _ = job.communicate(timeout=900)
    assert job.returncode == 0, output
    summary = json.loads((output_dir / "summary.json").read_text())
    assert summary["world_size"] == 1 and summary["epochs"] == 1
    assert summary["learning_rate"] == pytest.approx(0.002)
    assert summary["test_accuracy"] >= 0.98, summary
    # The rollback to the last commit dropped the records of the steps it undid.
    samples = [record["samples"] for record in train_records(output_dir)]
    assert samples == sorted(set(samples))


def test_a_worker_that_joins_holds_the_same_replica_under_weight_decay(mnist_dir, tmp_path):
    # Weight decay makes a zero-gradient step move the weights: the joining worker must not
    # take one (Horovod's own TorchState does, on the newcomer only). Two data workers read
    # ahead, and the resize starts their reading anew at the new shards.
    (tmp_path / "hosts").write_text("localhost:1\n")
    settings = ["--set", "optimizer.name=adamw", "--set", "optimizer.weight_decay=0.05",
                "--set", "data.workers=2"]  # fmt: skip
    job, output_dir = elastic_job(tmp_path, 1, "--data-dir", str(mnist_dir), *settings)
    wait_for((output_dir / "metrics.jsonl").exists, job)
    (tmp_path / "hosts").write_text("localhost:1\n127.0.0.1:1\n")  # a second worker joins
    output, _ = job.communicate(timeout=900)
    assert job.returncode == 0, output
    summary = json.loads((output_dir / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["epochs"] == 2  # it joined, and stayed
    assert summary["settings"]["data"]["workers"] == 2
    assert summary["learning_rate"] == pytest.approx(0.002)
    assert summary["test_accuracy"] >= 0.99, summary
