"""The container and cluster files: they use the tested pieces (the Horovod build script, the
CLI) and say what the README says. hadolint lints the Dockerfiles in `make lint`; the images are
built and run by tests/docker/test_images.py (`make test-containers`)."""

import subprocess

import pytest
import yaml

from tests.conftest import REPO

DOCKER = REPO / "docker"


@pytest.mark.parametrize("name", ["Dockerfile.cpu", "Dockerfile.cuda"])
def test_images_build_horovod_with_the_project_script_and_run_the_cli(name):
    text = (DOCKER / name).read_text()
    build, final = text.split("\nFROM ")[1:]
    assert "PYTHON=python scripts/build-horovod.sh" in build and "libopenmpi-dev" in build
    assert "HVD_TRAIN_PORTABLE=1 PYTHON=python" in build  # runs on any x86-64 host since 2009
    # The image that runs: no compiler, what horovodrun needs, the environment built before.
    assert "g++" not in final and "openmpi-bin" in final and "openssh-server" in final
    assert "COPY --from=build /opt/venv /opt/venv" in final
    assert final.rstrip().endswith('CMD ["python", "-m", "hvd_train"]')


def stub(folder, name, body='echo "$(basename "$0") $*" >> "$STUB_LOG"'):
    """An executable `name` in `folder` that records how it was called."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)


def test_compose_starts_a_launcher_and_two_workers_that_train_across_them(tmp_path):
    compose = yaml.safe_load((DOCKER / "compose.yaml").read_text())
    services = compose["services"]
    assert set(services) == {"keys", "worker1", "worker2", "launcher"}
    for name in ("worker1", "worker2", "launcher"):
        assert services[name]["environment"]["HVD_TRAIN_SSH_KEYS"] == "/keys"
        # Rank 0 runs on a worker: the run folder must be the host's there too.
        assert "${HVD_TRAIN_RUNS:-../runs}:/opt/hvd_train/runs" in services[name]["volumes"]
    # The launcher's command, run with ssh, nproc and horovodrun standing in ($$ is Compose's $).
    bin_dir, log = tmp_path / "bin", tmp_path / "calls"
    stub(bin_dir, "ssh", "exit 0")
    stub(bin_dir, "nproc", "echo 4")
    stub(bin_dir, "horovodrun", 'echo "threads=$HVD_TRAIN_THREADS $*" >> "$STUB_LOG"')
    command = [part.replace("$$", "$") for part in services["launcher"]["command"]]
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "STUB_LOG": str(log)}
    subprocess.run(command, env=env, check=True, timeout=30)
    assert log.read_text() == (
        "threads=2 -np 2 --gloo -H worker1:1,worker2:1 python -m hvd_train --recipe mnist_cnn "
        "--framework torch\n"
    )


def test_slurm_script_gives_every_task_a_rank_and_resumes_a_requeued_run(tmp_path):
    """The batch script, run as Slurm would run it on a three-node allocation of uneven tasks,
    with scontrol and horovodrun standing in: one -H entry per node with its tasks; run again
    once the run has a checkpoint (a requeue), it resumes. The real cluster:
    tests/docker/test_slurm.py."""
    log = tmp_path / "calls"
    stub(tmp_path / "bin", "scontrol", 'echo "node-a\nnode-b\nnode-c"')
    stub(tmp_path / ".venv" / "bin", "horovodrun")
    env = {"PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin", "STUB_LOG": str(log),
           "SLURM_SUBMIT_DIR": str(tmp_path), "SLURM_JOB_NODELIST": "node-[a-c]",
           "SLURM_TASKS_PER_NODE": "4(x2),2", "SLURM_NTASKS": "10",
           "SLURM_JOB_ID": "17"}  # fmt: skip
    launch = (
        "horovodrun --gloo -np 10 -H node-a:4,node-b:4,node-c:2 .venv/bin/python -m hvd_train "
        "--output-dir runs/slurm-17 --recipe mnist_cnn --framework torch"
    )
    subprocess.run(["bash", str(DOCKER / "slurm.sbatch")], env=env, check=True, timeout=30)
    assert log.read_text().splitlines() == [launch]
    (tmp_path / "runs/slurm-17/checkpoints/epoch-0000-sample-00000640").mkdir(parents=True)
    subprocess.run(["bash", str(DOCKER / "slurm.sbatch")], env=env, check=True, timeout=30)
    assert log.read_text().splitlines() == [launch, f"{launch} --resume"]


def test_entrypoint_without_ssh_keys_just_runs_the_command():
    result = subprocess.run(
        ["sh", str(DOCKER / "entrypoint.sh"), "echo", "ran"], capture_output=True, text=True,
        env={"PATH": "/usr/bin:/bin"}, check=True,
    )  # fmt: skip
    assert result.stdout == "ran\n"
