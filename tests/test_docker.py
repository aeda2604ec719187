"""The container and cluster files: they use the tested pieces (the Horovod build script, the
CLI) and say what the README says. hadolint lints the Dockerfiles in `make lint`; the images are
built and run by tests/containers (`make test-containers`)."""

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
    # The image that runs: no compiler, what horovodrun needs, the environment built before.
    assert "g++" not in final and "openmpi-bin" in final and "openssh-server" in final
    assert "COPY --from=build /opt/venv /opt/venv" in final
    assert final.rstrip().endswith('CMD ["python", "-m", "hvd_train"]')


def test_compose_starts_a_launcher_and_two_workers_that_train_across_them():
    compose = yaml.safe_load((DOCKER / "compose.yaml").read_text())
    services = compose["services"]
    assert set(services) == {"keys", "worker1", "worker2", "launcher"}
    launcher = " ".join(services["launcher"]["command"])
    assert "horovodrun -np 2 --gloo -H worker1:1,worker2:1" in launcher
    assert "export HVD_TRAIN_THREADS=" in launcher  # the workers share this machine
    assert "python -m hvd_train --recipe mnist_cnn" in launcher
    for name in ("worker1", "worker2", "launcher"):
        assert services[name]["environment"]["HVD_TRAIN_SSH_KEYS"] == "/keys"
        # Rank 0 runs on a worker: the run folder must be the host's there too.
        assert "${HVD_TRAIN_RUNS:-../runs}:/opt/hvd_train/runs" in services[name]["volumes"]


def test_mpijob_runs_the_recipe_with_horovodrun_on_the_operators_hostfile():
    job = yaml.safe_load((DOCKER / "mpijob.yaml").read_text())
    assert job["kind"] == "MPIJob"
    specs = job["spec"]["mpiReplicaSpecs"]
    command = specs["Launcher"]["template"]["spec"]["containers"][0]["command"]
    assert command[:5] == ["horovodrun", "-np", "2", "--hostfile", "/etc/mpi/hostfile"]
    assert command[5:8] == ["python", "-m", "hvd_train"]
    assert specs["Worker"]["replicas"] == 2


def test_slurm_script_is_valid_bash_using_horovodrun_across_the_allocation():
    script = DOCKER / "slurm.sbatch"
    subprocess.run(["bash", "-n", str(script)], check=True)
    text = script.read_text()
    assert (
        "scontrol show hostnames" in text and 'horovodrun -np "$SLURM_NTASKS" -H "$hosts"' in text
    )


def test_entrypoint_without_ssh_keys_just_runs_the_command():
    result = subprocess.run(
        ["sh", str(DOCKER / "entrypoint.sh"), "echo", "ran"], capture_output=True, text=True,
        env={"PATH": "/usr/bin:/bin"}, check=True,
    )  # fmt: skip
    assert result.stdout == "ran\n"
