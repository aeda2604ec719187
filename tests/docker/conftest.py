"""A Docker engine for the container tests: the one running, or one this test starts (as root,
where Debian's docker.io is installed), else the tests skip with the reason. Base images come
from Debian's packages with mmdebstrap, which needs no Docker Hub."""

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

PROJECT = "hvdtraintest"  # the compose project: its containers, network and volumes carry it
LABEL = "hvd-train-test"  # on every container the tests start outside compose
DEBIAN_CLI = Path("/usr/bin/docker")  # docker.io's CLI builds with BuildKit without buildx


def docker_cli() -> str | None:
    """A docker CLI that can build with BuildKit: one with the buildx plugin, or an older
    classic CLI (< 23, such as Debian 12's docker.io) that has BuildKit built in."""
    for cli in filter(None, [shutil.which("docker"), str(DEBIAN_CLI)]):
        if not Path(cli).exists():
            continue
        if subprocess.run([cli, "buildx", "version"], capture_output=True).returncode == 0:
            return cli
        version = subprocess.run([cli, "version", "--format", "{{.Client.Version}}"],
                                 capture_output=True, text=True).stdout  # fmt: skip
        if version.split(".")[0].isdigit() and int(version.split(".")[0]) < 23:
            return cli
    return None


def engine_runs(cli: str) -> bool:
    return subprocess.run([cli, "info"], capture_output=True).returncode == 0


@pytest.fixture(scope="session")
def docker(tmp_path_factory) -> Iterator[str]:
    """The docker CLI, talking to a running engine."""
    cli = docker_cli()
    if cli is None:
        pytest.skip("no docker CLI that builds with BuildKit (install docker.io or buildx)")
    started = None
    if not engine_runs(cli):
        if os.geteuid() != 0 or shutil.which("dockerd") is None:
            pytest.skip("no Docker engine runs, and this test can start one only as root where "
                        "dockerd is installed (Debian: apt-get install docker.io)")  # fmt: skip
        log = tmp_path_factory.mktemp("dockerd") / "dockerd.log"
        started = subprocess.Popen(["dockerd"], stdout=log.open("w"), stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while not engine_runs(cli):
            if started.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"dockerd did not start:\n{log.read_text()[-3000:]}")
            time.sleep(1)
    remove_leftovers(cli)  # of an earlier run that was killed before its clean-up
    yield cli
    remove_leftovers(cli)
    if started:
        started.terminate()
        started.wait(timeout=60)


def compose_cli(docker: str) -> list[str]:
    if subprocess.run([docker, "compose", "version"], capture_output=True).returncode == 0:
        return [docker, "compose"]
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    pytest.skip("no Docker Compose (install docker-compose, or Docker's compose plugin)")


def remove_leftovers(docker: str) -> None:
    """This suite's containers, compose networks and volumes; images stay, as a build cache."""
    labelled = subprocess.run([docker, "ps", "-aq", "--filter", f"label={LABEL}"],
                              capture_output=True, text=True).stdout.split()  # fmt: skip
    if labelled:
        subprocess.run([docker, "rm", "-f", *labelled], capture_output=True)
    for kind in ("container", "network", "volume"):
        listed = subprocess.run(
            [docker, kind, "ls", "-q", *(["-a"] if kind == "container" else []),
             "--filter", f"label=com.docker.compose.project={PROJECT}"],
            capture_output=True, text=True,
        ).stdout.split()  # fmt: skip
        if listed:  # networks take no --force
            force = [] if kind == "network" else ["--force"]
            subprocess.run([docker, kind, "rm", *force, *listed], capture_output=True)


def debian_base(docker: str, suite: str) -> str:
    """`hvd-train-base:SUITE`: Debian SUITE with python3 and its venv module, from Debian's
    packages. Made once per engine; mmdebstrap takes about a minute."""
    image = f"hvd-train-base:{suite}"
    if subprocess.run([docker, "image", "inspect", image], capture_output=True).returncode == 0:
        return image
    if shutil.which("mmdebstrap") is None:
        pytest.skip("mmdebstrap is not installed (Debian: apt-get install mmdebstrap)")
    root = subprocess.Popen(
        ["mmdebstrap", "--quiet", "--variant=minbase",
         "--include=python3,python3-venv,ca-certificates", suite, "-"],
        stdout=subprocess.PIPE,
    )  # fmt: skip
    imported = subprocess.run([docker, "import", "-c", 'CMD ["bash"]', "-", image],
                              stdin=root.stdout, capture_output=True, text=True)  # fmt: skip
    assert root.wait() == 0 and imported.returncode == 0, imported.stderr
    return image
