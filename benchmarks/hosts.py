"""Two hosts on one machine: Linux network namespaces with their own addresses, joined by a
bridge, each with a key-only sshd, so that horovodrun starts ranks on both over SSH as it would
across machines. The multi-host tests and `benchmarks.links` (the same link, rate-limited) use
them. Needs root, iproute2 and openssh-server; everything is torn down afterwards.

The hosts share this machine's file system, so the same Python sits at the same path, as on a
cluster with a shared disk.
"""

import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

SUBNET = "10.213.7"  # addresses exist only inside the namespaces made here
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
    """What an earlier run killed before its clean-up left: its namespaces and the sshd in
    each (which would keep a deleted namespace alive), their hosts files, its bridge and its
    iptables rules."""
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
            namespace = line.split()[0]
            pids = subprocess.run(["ip", "netns", "pids", namespace], capture_output=True,
                                  text=True).stdout.split()  # fmt: skip
            if pids:
                subprocess.run(["kill", *pids], capture_output=True)
            subprocess.run(["ip", "netns", "del", namespace], capture_output=True)
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


@dataclass(frozen=True)
class Hosts:
    key: Path  # an SSH identity file that reaches both hosts
    namespaces: list[str]  # each host's namespace, in the order of HOSTS


@contextmanager
def two_hosts(work: Path) -> Iterator[Hosts]:
    """Makes hvd-host-a and hvd-host-b, keeping their keys and sshd files in `work`."""
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
        yield Hosts(key, namespaces)
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


def shape(hosts: Hosts, gbit_per_s: float | None) -> None:
    """Limits what each host sends to `gbit_per_s` (a token bucket on its link; None: no
    limit). The bucket holds 128 KB: two of the large segments a veth passes, a millisecond at
    1 Gbit/s."""
    for namespace in hosts.namespaces:
        inside = ["ip", "netns", "exec", namespace, "tc", "qdisc"]
        subprocess.run([*inside, "del", "dev", "eth0", "root"], capture_output=True)
        if gbit_per_s:
            sh(*inside, "add", "dev", "eth0", "root", "tbf", "rate", f"{gbit_per_s * 1000:g}mbit",
               "burst", "128kb", "latency", "200ms")  # fmt: skip
