"""A Slurm cluster on one machine, for the tests: slurmctld on this host and one slurmd in each
of the two network-namespace hosts of `benchmarks.hosts` (hvd-host-a, hvd-host-b, each with its
own name, address and sshd), authenticated by a munged of its own. Everything lives in one work
folder (configuration, key, sockets, state, logs) and is stopped afterwards.

Debian's slurm-wlm 22.05 and munge, as `scripts/install-system-packages.sh --clusters` installs
them; no cgroup plugins (processes are tracked by their parents), root runs everything.
"""

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psutil

from benchmarks.hosts import HOSTS, SUBNET, Hosts, two_hosts

DAEMONS = ("munged", "slurmctld", "slurmd", "sbatch", "scontrol")


def cannot_run_slurm() -> str | None:
    """Why a Slurm cluster cannot be made here, or None."""
    missing = [name for name in DAEMONS if shutil.which(name) is None]
    if missing:
        return (
            f"needs {', '.join(missing)}: run scripts/install-system-packages.sh --clusters "
            "as root (make test-clusters does)"
        )
    return None


@dataclass(frozen=True)
class Cluster:
    hosts: Hosts  # the two nodes, and an SSH key that reaches both
    environment: dict[str, str]  # what Slurm's commands need to find this cluster
    work: Path

    def run(self, *command: str, timeout: float = 60) -> subprocess.CompletedProcess:
        """A Slurm command (sbatch, squeue, scontrol, ...) against this cluster."""
        return subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                              env=self.environment)  # fmt: skip


def configuration(work: Path) -> str:
    controller = socket.gethostname()
    nodes = "".join(
        f"NodeName={name} NodeAddr={address} CPUs=1 State=UNKNOWN\n"
        for name, address in HOSTS.items()
    )
    return (
        f"ClusterName=hvdtest\nSlurmctldHost={controller}({SUBNET}.1)\n"
        "SlurmUser=root\nSlurmdUser=root\n"
        f"AuthType=auth/munge\nAuthInfo=socket={work}/munge.socket\n"
        "CredType=cred/munge\n"
        "ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\n"
        "JobAcctGatherType=jobacct_gather/none\nMpiDefault=none\n"
        "SelectType=select/cons_tres\nSelectTypeParameters=CR_CPU\n"
        "SlurmctldPort=6917\nSlurmdPort=6918\n"
        f"StateSaveLocation={work}/state\nSlurmdSpoolDir={work}/spool-%n\n"
        f"SlurmctldPidFile={work}/slurmctld.pid\nSlurmdPidFile={work}/slurmd-%n.pid\n"
        f"SlurmctldLogFile={work}/slurmctld.log\nSlurmdLogFile={work}/slurmd-%n.log\n"
        # A requeued job may start again at once, and a stopped job gets 30 s from SIGTERM to
        # SIGKILL (Slurm's default grace period) to checkpoint.
        "JobRequeue=1\nKillWait=30\nReturnToService=2\nMinJobAge=600\n"
        f"{nodes}PartitionName=main Nodes=ALL Default=YES MaxTime=INFINITE State=UP\n"
    )


@contextmanager
def slurm_cluster(work: Path) -> Iterator[Cluster]:
    """The cluster, up with both nodes idle; stopped and removed afterwards."""
    remove_leftover_daemons()
    with two_hosts(work) as hosts:
        conf = work / "slurm.conf"
        conf.write_text(configuration(work))
        (work / "state").mkdir()
        key = work / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        environment = os.environ | {"SLURM_CONF": str(conf)}
        daemons: list[subprocess.Popen] = []
        try:
            daemons.append(start([
                "munged", "--foreground", "--force", f"--socket={work}/munge.socket",
                f"--key-file={key}", f"--pid-file={work}/munged.pid",
                f"--log-file={work}/munged.log", f"--seed-file={work}/munged.seed",
            ], environment))  # fmt: skip
            wait_until(lambda: (work / "munge.socket").exists(), "munged did not start", work)
            daemons.append(start(["slurmctld", "-D", "-i", "-f", str(conf)], environment))
            for namespace, name in zip(hosts.namespaces, HOSTS, strict=True):
                # nsenter, not `ip netns exec`, which would mount a /sys without the cgroup
                # hierarchies that slurmd looks at as it starts.
                (work / f"spool-{name}").mkdir()
                daemons.append(start(["nsenter", f"--net=/run/netns/{namespace}", "unshare",
                                      "--uts", "sh", "-c", f'hostname {name} && exec "$@"',
                                      "slurmd", "slurmd", "-D", "-N", name, "-f", str(conf)],
                                     environment))  # fmt: skip
            cluster = Cluster(hosts, environment, work)
            wait_until(lambda: nodes_idle(cluster), "the nodes did not come up", work)
            yield cluster
        finally:
            for daemon in reversed(daemons):
                stop(daemon)
            for namespace in hosts.namespaces:  # what the jobs left (ranks started over SSH)
                pids = subprocess.run(["ip", "netns", "pids", namespace], capture_output=True,
                                      text=True).stdout.split()  # fmt: skip
                subprocess.run(["kill", "-9", *pids], capture_output=True)


def remove_leftover_daemons() -> None:
    """What a killed earlier run left: daemons of a test cluster (a configuration or socket in
    a test's work folder, not the system's), which hold the cluster's ports."""
    for process in psutil.process_iter(["name", "cmdline"]):
        arguments = " ".join(process.info["cmdline"] or [])
        ours = "/slurm.conf" in arguments and "/etc/slurm" not in arguments
        if process.info["name"] in DAEMONS and (ours or "--socket=/tmp/" in arguments):
            process.kill()


def start(command: list[str], environment: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen(command, env=environment, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)  # fmt: skip


def stop(daemon: subprocess.Popen) -> None:
    """Ends a daemon and what it started (a slurmd's job steps among them)."""
    if daemon.poll() is None:
        os.killpg(daemon.pid, 15)
        try:
            daemon.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(daemon.pid, 9)
            daemon.wait(timeout=20)


def nodes_idle(cluster: Cluster) -> bool:
    states = cluster.run("sinfo", "--noheader", "--Node", "--format=%N %t").stdout.split("\n")
    return sorted(line.strip() for line in states if line.strip()) == [
        f"{name} idle" for name in sorted(HOSTS)
    ]


def wait_until(condition, failure: str, work: Path, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            logs = "".join(f"\n--- {log.name}\n{log.read_text()[-3000:]}"
                           for log in sorted(work.glob("*.log")))  # fmt: skip
            raise AssertionError(f"{failure}{logs}")
        time.sleep(0.5)
