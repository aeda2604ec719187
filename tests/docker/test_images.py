"""The images, built and run: the CPU image on Debian 12 trains across containers with the compose
file (a launcher and two workers, horovodrun over SSH), evaluates and checks itself; on Debian 13
(gcc 14, Python 3.13), Horovod builds and trains under TensorFlow. `make test-containers` runs
these (20 minutes from an empty engine on 2 cores, mostly compiling Horovod twice); `make test`
does not.
"""

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.docker.conftest import LABEL, PROJECT, compose_cli, debian_base

pytestmark = [pytest.mark.containers, pytest.mark.timeout(3600)]
WHEELS = REPO / "docker" / "wheels"
MNIST_IN_IMAGE = "/root/.cache/hvd_train/mnist"


def ca_bundle() -> Path | None:
    """The certificate bundle this machine trusts, for pip inside the build."""
    for candidate in (os.environ.get("PIP_CERT"), os.environ.get("SSL_CERT_FILE"),
                      "/etc/ssl/certs/ca-certificates.crt"):  # fmt: skip
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    return None


def local_torch_wheels() -> list[Path]:
    """torch CPU wheels lying in pip's find-links folders on this machine."""
    folders = os.environ.get("PIP_FIND_LINKS", "").split()
    return [wheel for folder in folders for wheel in Path(folder).glob("torch-*+cpu-*.whl")]


def build(docker: str, base: str, tag: str, frameworks: str) -> str:
    """Builds docker/Dockerfile.cpu; returns its output. Torch's CPU wheel comes from this
    machine's wheelhouse where it has one (PyTorch's index is then not asked)."""
    arguments = ["--build-arg", f"BASE={base}", "--build-arg", f"FRAMEWORKS={frameworks}"]
    wheels = local_torch_wheels()
    for wheel in wheels:
        if not (WHEELS / wheel.name).exists():
            try:
                os.link(wheel, WHEELS / wheel.name)
            except OSError:  # another file system
                shutil.copy(wheel, WHEELS / wheel.name)
    if wheels:
        arguments += ["--build-arg", "TORCH_INDEX="]
    bundle = ca_bundle()
    if bundle:
        arguments += ["--secret", f"id=ca,src={bundle}"]
    command = [docker, "build", "--progress=plain", "-f", "docker/Dockerfile.cpu", *arguments,
               "-t", tag, "."]  # fmt: skip
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True,
                            env={**os.environ, "DOCKER_BUILDKIT": "1"})  # fmt: skip
    assert result.returncode == 0, result.stderr[-5000:]
    return result.stderr  # BuildKit's progress goes to stderr


def run(docker: str, image: str, *command: str, volumes: dict[str, str]) -> str:
    mounts = [option for host, inside in volumes.items() for option in ("-v", f"{host}:{inside}")]
    result = subprocess.run([docker, "run", "--rm", "--label", LABEL, *mounts, image, *command],
                            capture_output=True, text=True, timeout=900)  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


@pytest.fixture(scope="module")
def cpu_image(docker) -> str:
    """hvd-train:cpu on Debian 12 (Python 3.11, gcc 12), both frameworks."""
    build(docker, debian_base(docker, "bookworm"), "hvd-train:cpu", "torch tensorflow")
    return "hvd-train:cpu"


@pytest.fixture(scope="module")
def compose_run(docker, cpu_image, mnist_dir, tmp_path_factory) -> Path:
    """The compose job, run to its end; its run folder on this host."""
    runs = tmp_path_factory.mktemp("runs")
    compose = [*compose_cli(docker), "-p", PROJECT, "-f", str(REPO / "docker" / "compose.yaml")]
    env = {**os.environ, "HVD_TRAIN_RUNS": str(runs), "HVD_TRAIN_MNIST": str(mnist_dir)}
    try:
        subprocess.run([*compose, "up", "--detach", "--no-build"], env=env, check=True,
                       capture_output=True, timeout=300)  # fmt: skip
        launcher = subprocess.run([*compose, "ps", "-q", "launcher"], env=env, check=True,
                                  capture_output=True, text=True).stdout.strip()  # fmt: skip
        waited = subprocess.run([docker, "wait", launcher], capture_output=True, text=True,
                                timeout=1800)  # fmt: skip
        logs = subprocess.run([*compose, "logs", "--no-color"], env=env, capture_output=True,
                              text=True).stdout  # fmt: skip
        assert waited.stdout.strip() == "0", logs[-5000:]
    finally:
        subprocess.run([*compose, "down", "--volumes", "--remove-orphans", "--timeout", "5"],
                       env=env, capture_output=True)  # fmt: skip
    (summary,) = runs.glob("*/summary.json")
    return summary.parent


def test_the_compose_job_trains_across_two_containers(compose_run):
    summary = json.loads((compose_run / "summary.json").read_text())
    assert summary["hosts"] == {"worker1": 1, "worker2": 1}
    assert summary["world_size"] == 2 and summary["framework"] == "torch"
    assert summary["test_accuracy"] >= 0.99  # the recipe's bar, as on the host


@pytest.mark.parametrize("framework", ["torch", "tensorflow"])
def test_eval_in_a_container_scores_the_jobs_checkpoint(framework, docker, cpu_image,
                                                       compose_run, mnist_dir):  # fmt: skip
    summary = json.loads((compose_run / "summary.json").read_text())
    output = run(docker, cpu_image, "python", "-m", "hvd_train", "eval", "--framework", framework,
                 "--checkpoint", "/run", "--json",
                 volumes={str(compose_run): "/run", str(mnist_dir): MNIST_IN_IMAGE})  # fmt: skip
    result = json.loads(output.strip().splitlines()[-1])
    assert result["test_accuracy"] == pytest.approx(summary["test_accuracy"], abs=0.002)


def test_doctor_in_a_container_passes(docker, cpu_image, mnist_dir):
    output = run(docker, cpu_image, "python", "-m", "hvd_train", "doctor",
                 volumes={str(mnist_dir): MNIST_IN_IMAGE})  # fmt: skip
    assert "[ok] horovod frameworks: PyTorch, TensorFlow" in output
    assert "[ok] horovod controllers: Gloo, MPI" in output
    assert "all checks passed" in output


def test_the_image_holds_no_compiler(docker, cpu_image):
    """The build stage compiled Horovod; the final stage starts again from the base."""
    found = run(docker, cpu_image, "sh", "-c", "command -v gcc g++ cmake || echo none", volumes={})
    assert found.strip() == "none"


def test_debian_13_builds_horovod_and_trains_under_tensorflow(docker, mnist_dir, tmp_path):
    """Debian 13: gcc 14 and Python 3.13. Torch's CPU wheel for 3.13 comes only from PyTorch's
    index (PyPI's is a CUDA build of several GB); where that index is unreachable and no wheel
    lies on disk, the image has TensorFlow alone, and the build says so."""
    base = debian_base(docker, "trixie")
    versions = run(docker, base, "sh", "-c", "python3 --version", volumes={})
    assert versions.startswith("Python 3.13")
    log = build(docker, base, "hvd-train:trixie-tensorflow", "tensorflow")
    assert "PyTorch is not installed for python: building Horovod without it" in log
    run(docker, "hvd-train:trixie-tensorflow", "horovodrun", "-np", "2", "--gloo", "python", "-m",
        "hvd_train", "--framework", "tensorflow", "--epochs", "1", "--limit-steps", "60",
        "--output-dir", "/out/run",
        volumes={str(tmp_path): "/out", str(mnist_dir): MNIST_IN_IMAGE})  # fmt: skip
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["framework"] == "tensorflow"
    assert summary["test_accuracy"] >= 0.9
