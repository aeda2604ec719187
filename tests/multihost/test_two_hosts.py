"""Two real hosts on one machine: Linux network namespaces with their own addresses, each with a
key-only sshd, and horovodrun starting ranks on both over SSH, as it would across machines.

The hosts share this machine's file system, so the same Python sits at the same path, as on a
cluster with a shared disk. Everything is torn down afterwards, so the test can run repeatedly.
"""

import json
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

from hvd_train.checkpoint import checkpoint_name
from tests.multiprocess.conftest import HOROVODRUN

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow, pytest.mark.torch,
              pytest.mark.timeout(1200)]  # fmt: skip
SUBNET = "10.213.7"  # addresses exist only inside the namespaces this test makes
HOSTS = {"hvd-host-a": f"{SUBNET}.2", "hvd-host-b": f"{SUBNET}.3"}
HOSTS_MARK = "# hvd_train multi-host test"
SSHD = Path("/usr/sbin/sshd")


def sh(*command: str) -> None:
    subprocess.run(command, check=True, capture_output=True, text=True)


def cannot_make_hosts() -> str | None:
    """Why namespaces cannot be made here, or None."""
    if os.geteuid() != 0:
        return "creating network namespaces needs root"
    if not SSHD.exists() or shutil.which("ip") is None:
        return "needs iproute2 and openssh-server (make setup installs them as root)"
    probe = f"hvdprobe{uuid.uuid4().hex[:6]}"
    if subprocess.run(["ip", "netns", "add", probe], capture_output=True).returncode != 0:
        return "this machine does not allow creating network namespaces"
    sh("ip", "netns", "del", probe)
    return None


def forwarding_rule(bridge: str) -> list[str] | None:
    """The iptables rule that lets traffic cross the bridge, where iptables exists: where Docker
    ran, the FORWARD chain drops bridged traffic by default (it sets the policy and makes the
    bridge netfilter module filter bridges), and the hosts could not reach each other."""
    if shutil.which("iptables") is None:
        return None
    return ["FORWARD", "-i", bridge, "-o", bridge, "-j", "ACCEPT"]


def remove_leftovers() -> None:
    """What an earlier run killed before its clean-up left: its namespaces, their hosts files,
    its bridge and its iptables rules."""
    if shutil.which("iptables"):
        listed = subprocess.run(["iptables", "-S", "FORWARD"], capture_output=True, text=True)
        for rule in listed.stdout.splitlines():
            if rule.startswith("-A FORWARD") and " hvdtbr" in rule:
                subprocess.run(["iptables", "-D", *rule.split()[1:]], capture_output=True)
    for folder in Path("/etc/netns").glob("hvdtns*"):
        shutil.rmtree(folder, ignore_errors=True)
    for line in subprocess.run(
        ["ip", "netns", "list"], capture_output=True, text=True
    ).stdout.splitlines():
        if line.startswith("hvdtns"):
            subprocess.run(["ip", "netns", "del", line.split()[0]], capture_output=True)
    links = subprocess.run(
        ["ip", "-o", "link", "show", "type", "bridge"], capture_output=True, text=True
    )
    for line in links.stdout.splitlines():
        name = line.split(":")[1].strip()
        if name.startswith("hvdtbr"):
            subprocess.run(["ip", "link", "del", name], capture_output=True)


def forget_host_keys() -> None:
    """Removes the test hosts from the user's known_hosts (ssh adds them as it connects)."""
    if (Path.home() / ".ssh" / "known_hosts").exists():
        for entry in [*HOSTS, *HOSTS.values()]:
            subprocess.run(["ssh-keygen", "-R", entry], capture_output=True)


@pytest.fixture(scope="module")
def two_hosts(tmp_path_factory) -> Iterator[Path]:
    """Makes hvd-host-a and hvd-host-b; yields an SSH identity file that reaches both."""
    reason = cannot_make_hosts()
    if reason:
        pytest.skip(reason)
    work = tmp_path_factory.mktemp("hosts")
    key = work / "id_ed25519"
    sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key))
    sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(work / "host_key"))
    shutil.copy(work / "id_ed25519.pub", work / "authorized_keys")
    Path("/run/sshd").mkdir(exist_ok=True)
    remove_leftovers()
    tag = uuid.uuid4().hex[:5]
    bridge = f"hvdtbr{tag}"
    namespaces = [f"hvdtns{tag}{i}" for i in range(len(HOSTS))]
    hosts_file = Path("/etc/hosts")
    original_hosts = "".join(
        line for line in hosts_file.read_text().splitlines(keepends=True) if HOSTS_MARK not in line
    )
    forget_host_keys()  # each run makes new host keys; ssh must not hold on to older ones
    rule = forwarding_rule(bridge)
    try:
        sh("ip", "link", "add", bridge, "type", "bridge")
        sh("ip", "addr", "add", f"{SUBNET}.1/24", "dev", bridge)
        sh("ip", "link", "set", bridge, "up")
        if rule:
            sh("iptables", "-I", *rule)
        entries = "".join(f"{address} {name} {HOSTS_MARK}\n" for name, address in HOSTS.items())
        hosts_file.write_text(original_hosts + entries)
        for namespace, (name, address) in zip(namespaces, HOSTS.items(), strict=True):
            sh("ip", "netns", "add", namespace)
            sh("ip", "link", "add", f"{namespace}v", "type", "veth", "peer", "name", "eth0",
               "netns", namespace)  # fmt: skip
            sh("ip", "link", "set", f"{namespace}v", "master", bridge, "up")
            inside = ["ip", "netns", "exec", namespace]
            sh(*inside, "ip", "addr", "add", f"{address}/24", "dev", "eth0")
            sh(*inside, "ip", "link", "set", "eth0", "up")
            sh(*inside, "ip", "link", "set", "lo", "up")
            # The launcher may listen on this machine's other addresses: route them via the bridge.
            sh(*inside, "ip", "route", "add", "default", "via", f"{SUBNET}.1")
            # Its own host name too (a UTS namespace), resolving to 127.0.1.1 as Debian sets it
            # up (`ip netns exec` mounts /etc/netns/NAMESPACE/hosts on /etc/hosts): stock
            # Horovod's Gloo process sets then listen on loopback, and the job hangs.
            own = Path("/etc/netns") / namespace
            own.mkdir(parents=True, exist_ok=True)
            (own / "hosts").write_text(f"127.0.1.1 {name}\n" + original_hosts + entries)
            sh(*inside, "unshare", "--uts", "sh", "-c", f'hostname {name} && exec "$@"', "sshd",
               str(SSHD), "-h", str(work / "host_key"), "-o", f"ListenAddress={address}",
               "-o", f"AuthorizedKeysFile={work / 'authorized_keys'}", "-o", "StrictModes=no",
               "-o", "PasswordAuthentication=no", "-o", "KbdInteractiveAuthentication=no",
               "-o", f"PidFile={work / namespace}.pid")  # fmt: skip
        yield key
    finally:
        for pid_file in work.glob("*.pid"):
            subprocess.run(["kill", pid_file.read_text().strip()], capture_output=True)
        for namespace in namespaces:
            subprocess.run(["ip", "netns", "del", namespace], capture_output=True)
            shutil.rmtree(Path("/etc/netns") / namespace, ignore_errors=True)
        subprocess.run(["ip", "link", "del", bridge], capture_output=True)
        if rule:
            subprocess.run(["iptables", "-D", *rule], capture_output=True)
        hosts_file.write_text(original_hosts)
        forget_host_keys()


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


def final_weights(output: Path) -> dict[str, np.ndarray]:
    return load_file(output / "checkpoints" / checkpoint_name(1, 0) / "model.safetensors")


def test_ssh_is_key_only(two_hosts):
    command = ["ssh", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no", "hvd-host-a", "true"]
    assert subprocess.run(command, capture_output=True).returncode == 255  # no key, no entry
    keyed = [*command[:1], "-i", str(two_hosts), *command[1:]]
    assert subprocess.run(keyed, capture_output=True).returncode == 0


@pytest.fixture(scope="module")
def one_host(mnist_dir, tmp_path_factory) -> tuple[dict, dict[str, np.ndarray]]:
    """The same job on one host: its summary and final weights."""
    output = tmp_path_factory.mktemp("alone") / "run"
    return train(None, ["-H", "localhost:4"], output, mnist_dir), final_weights(output)


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
    got = final_weights(tmp_path / "across")
    assert expected.keys() == got.keys()
    for name in expected:
        np.testing.assert_array_equal(got[name], expected[name], err_msg=name)


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
