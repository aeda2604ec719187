"""Two real hosts on one machine (`benchmarks.hosts`: network namespaces, each with a key-only
sshd), and horovodrun starting ranks on both over SSH, as it would across machines. Everything is
torn down afterwards, so the test can run repeatedly."""

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from benchmarks.hosts import HOSTS, cannot_make_hosts
from benchmarks.hosts import two_hosts as make_two_hosts
from tests.helpers import assert_same_weights, saved_weights
from tests.horovodrun import HOROVODRUN

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow, pytest.mark.torch,
              pytest.mark.timeout(1200)]  # fmt: skip


@pytest.fixture(scope="module")
def two_hosts(tmp_path_factory) -> Iterator[Path]:
    """hvd-host-a and hvd-host-b; yields an SSH identity file that reaches both."""
    reason = cannot_make_hosts()
    if reason:
        pytest.skip(reason)
    with make_two_hosts(tmp_path_factory.mktemp("hosts")) as hosts:
        yield hosts.key


def train(key: Path | None, launch: list[str], output: Path, mnist_dir: Path) -> dict:
    # Each namespace's only link is eth0; name it, or Horovod may pick loopback, which both share.
    ssh = ["--ssh-identity-file", str(key), "--network-interface", "eth0"] if key else []
    command = [str(HOROVODRUN), "-np", "4", "--gloo", *launch, *ssh, sys.executable, "-m",
               "hvd_train", "--framework", "torch", "--data-dir", str(mnist_dir), "--epochs", "1",
               "--limit-steps", "20", "--output-dir", str(output)]  # fmt: skip
    # Without tensor fusion each gradient is summed on its own, in an order set by the ranks alone;
    # fused, an element's order depends on which tensors happened to share the buffer.
    env = {**os.environ, "HOROVOD_FUSION_THRESHOLD": "0"}
    result = subprocess.run(command, capture_output=True, text=True, timeout=900, cwd=output.parent,
                            env=env)  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    return json.loads((output / "summary.json").read_text())


def test_ssh_is_key_only(two_hosts):
    command = ["ssh", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no", "hvd-host-a", "true"]
    assert subprocess.run(command, capture_output=True).returncode == 255  # no key, no entry
    keyed = [*command[:1], "-i", str(two_hosts), *command[1:]]
    assert subprocess.run(keyed, capture_output=True).returncode == 0


@pytest.fixture(scope="module")
def one_host(mnist_dir, tmp_path_factory) -> tuple[dict, dict[str, np.ndarray]]:
    """The same job on one host: its summary and final weights."""
    output = tmp_path_factory.mktemp("alone") / "run"
    return train(None, ["-H", "localhost:4"], output, mnist_dir), saved_weights(output, 1)


@pytest.mark.parametrize("launch", ["hosts", "hostfile"])
def test_training_across_two_hosts_matches_one_host(launch, two_hosts, one_host, mnist_dir,
                                                    tmp_path):  # fmt: skip
    if launch == "hosts":
        placement = ["-H", "hvd-host-a:2,hvd-host-b:2"]
    else:
        hostfile = tmp_path / "hostfile"
        hostfile.write_text("hvd-host-a slots=2\nhvd-host-b slots=2\n")
        placement = ["--hostfile", str(hostfile)]
    across = train(two_hosts, placement, tmp_path / "across", mnist_dir)
    assert across["hosts"] == {"hvd-host-a": 2, "hvd-host-b": 2}
    alone, expected = one_host
    assert alone["world_size"] == across["world_size"] == 4
    # The same job: the same data, seeds, steps and order of sums, so the same numbers, bit for bit.
    assert across["test_accuracy"] == alone["test_accuracy"]
    assert_same_weights(expected, saved_weights(tmp_path / "across", 1))


def test_doctor_checks_both_hosts(two_hosts, mnist_dir):
    hosts = ["-H", "hvd-host-a:2,hvd-host-b:2", "--ssh-identity-file", str(two_hosts)]
    command = [sys.executable, "-m", "hvd_train", "doctor", "--data-dir", str(mnist_dir), *hosts]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout
    for host in HOSTS:
        assert f"[ok] {host}: ssh: reachable without a password" in result.stdout
        assert f"[ok] {host}: python: {sys.executable} present" in result.stdout
        assert f"[ok] {host}: versions: same" in result.stdout
        # Debian's loopback mapping is advice now, not a failure.
        assert f"[ok] {host}: host name: {host} resolves to 127.0.1.1 (loopback" in result.stdout
