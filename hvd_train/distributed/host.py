"""What a rank takes of its host: Horovod's settings where the environment gives none, its share
of the CPU cores, and glibc's malloc kept from handing each step's memory back."""

from __future__ import annotations

import ctypes
import math
import os
import platform
from pathlib import Path
from types import ModuleType

from hvd_train.errors import UsageError

# Horovod settings hvd_train applies where the environment gives none. A cycle of 3 ms instead of
# Horovod's 1 ms: where every cycle is a negotiation round of all ranks (MPI; Gloo while a tensor
# waits for a slower rank), fewer rounds leave more of shared cores to the computation. How it
# was measured: docs/history.md, "Speed".
HOROVOD_DEFAULTS = {"HOROVOD_CYCLE_TIME": "3"}
# glibc malloc's parameters (malloc.h's M_TRIM_THRESHOLD and M_MMAP_THRESHOLD) and what
# `keep_freed_memory` sets them to: the largest threshold glibc would move its own to, and four
# times it kept free before memory goes back to the system.
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
MMAP_THRESHOLD_BYTES = 32 * 2**20
TRIM_THRESHOLD_BYTES = 128 * 2**20


def start_horovod(hvd: ModuleType) -> None:
    """Horovod's binding `hvd` started (or joined, where a launcher started the job), with
    HOROVOD_DEFAULTS where the environment gives none (hvd.init reads them) and malloc keeping
    the memory a step frees."""
    for name, value in HOROVOD_DEFAULTS.items():
        os.environ.setdefault(name, value)
    keep_freed_memory()
    hvd.init()


def host_name() -> str:
    """This rank's host as horovodrun named it (-H, --hostfile), else the machine's name."""
    return os.environ.get("HOROVOD_HOSTNAME") or platform.node()


def threads_per_rank(local_size: int) -> int:
    """This process's share of the CPU cores, so the `local_size` ranks of a host do not
    oversubscribe it; $HVD_TRAIN_THREADS overrides it."""
    given = os.environ.get("HVD_TRAIN_THREADS", "")
    if given:
        if not given.isdigit() or int(given) < 1:
            raise UsageError(f"HVD_TRAIN_THREADS={given!r}: expected a positive integer")
        return int(given)
    return max(1, available_cores() // local_size)


def keep_freed_memory() -> None:
    """Have glibc's malloc keep the memory a step frees for the next step rather than give it
    back to the system and fault it in again. By default it hands back the free top of its heap
    above a threshold that follows the allocations' sizes; with a data source that allocates
    beside the passes it handed back and faulted in each step's activations, which slowed the
    passes (docs/history.md, "Decoding beside the step"). Left alone where the
    environment sets malloc's parameters itself, or without glibc."""
    tunables = os.environ.get("GLIBC_TUNABLES", "")
    if "glibc.malloc." in tunables or any(name.startswith("MALLOC_") for name in os.environ):
        return
    mallopt = getattr(ctypes.CDLL(None), "mallopt", None)
    if mallopt is None:
        return
    mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)
    mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES)


def available_cores(cgroup: Path = Path("/sys/fs/cgroup")) -> int:
    """The cores this process may use: its CPU affinity, capped by a cgroup CPU quota (a
    container's --cpus, a Kubernetes CPU limit), which the affinity does not show."""
    cores = len(os.sched_getaffinity(0))
    quota = cgroup_cpu_quota(cgroup)
    return max(1, min(cores, math.floor(quota))) if quota else cores


def cgroup_cpu_quota(cgroup: Path) -> float | None:
    """The CPU quota in cores, from cgroup v2's cpu.max or v1's CFS files; None if unlimited."""
    try:
        limit, period = (cgroup / "cpu.max").read_text().split()
        return None if limit == "max" else int(limit) / int(period)
    except (OSError, ValueError):
        pass
    try:
        cfs_quota = int((cgroup / "cpu" / "cpu.cfs_quota_us").read_text())
        cfs_period = int((cgroup / "cpu" / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    return cfs_quota / cfs_period if cfs_quota > 0 else None
