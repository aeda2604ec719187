"""Jobs under the real `horovodrun`, which the tests marked `multiprocess` start: run one and
check it ended well (`horovodrun`), several runs of hvd-train in one job (`trainings`), a job in
the background to signal or kill (`start`, `kill_job`), one that must fail in one line
(`failed_job`). The scripts the jobs run are in tests/jobs/ (`script`)."""

import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

JOBS = Path(__file__).resolve().parent / "jobs"  # the scripts the tests start
HOROVODRUN = Path(sys.executable).parent / "horovodrun"
TIMEOUT = 600
STEPS = 60  # per epoch and rank in the short runs: enough to learn, quick to run


def horovodrun(
    *arguments: str,
    horovodrun_options: list[str] | None = None,
    ranks: int = 2,
    timeout: float = TIMEOUT,
) -> subprocess.CompletedProcess:
    """`horovodrun -np RANKS OPTIONS python ARGUMENTS...` with a hard timeout; fails unless 0.
    The controller is Gloo unless OPTIONS say otherwise (horovodrun would pick MPI where built)."""
    options = ["-np", str(ranks), *(horovodrun_options or ["--gloo"])]
    command = [str(HOROVODRUN), *options, sys.executable, *arguments]
    result = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    if result.returncode != 0:
        pytest.fail(
            f"{' '.join(command)} exited {result.returncode}:\n{result.stdout}\n{result.stderr}"
        )
    return result


def trainings(*runs: list[str], **options) -> list[str]:
    """Each list of `hvd-train` arguments run in turn in one `horovodrun` job (cli_runs.py),
    the job's start paid once, as `horovodrun(..., **options)` runs it: what each run printed,
    its stdout then its stderr (every rank's lines)."""
    arguments = [argument for run in runs for argument in ("+", *run)][1:]
    result = horovodrun(script("cli_runs.py"), *arguments, **options)
    streams = []
    for name, output in (("stdout", result.stdout), ("stderr", result.stderr)):
        marker = rf"^\[0\]<{name}>:cli_runs\.py: run \d+\n"
        printed = re.split(marker, output, flags=re.MULTILINE)
        assert len(printed) == len(runs) + 1, output
        streams.append(printed[1:])
    return [stdout + stderr for stdout, stderr in zip(*streams, strict=True)]


STARTED: list[subprocess.Popen] = []  # jobs the tests started in the background


def start(*arguments: str) -> subprocess.Popen:
    """`horovodrun -np 2 --gloo python -m hvd_train ARGUMENTS` in the background; killed with
    all its workers at the end of the test if it still runs then."""
    command = [str(HOROVODRUN), "-np", "2", "--gloo", sys.executable, "-m", "hvd_train", *arguments]
    return background(command)


def background(command: list[str], **options) -> subprocess.Popen:
    job = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **options
    )
    STARTED.append(job)
    return job


def kill_job(job: subprocess.Popen, sig: int = signal.SIGKILL) -> None:
    """Kills horovodrun and every worker it started."""
    processes = [*psutil.Process(job.pid).children(recursive=True), psutil.Process(job.pid)]
    for process in processes:
        process.send_signal(sig)
    job.wait(timeout=60)


def rank_children(job: subprocess.Popen) -> list[tuple[psutil.Process, str, list[str]]]:
    """The job's processes that carry a HOROVOD_RANK, with it and their command lines, in
    psutil's order (a parent before its children). A process that ends while it is looked at
    (horovodrun's helpers, an elastic job's discovery script) is left out."""
    found = []
    for process in psutil.Process(job.pid).children(recursive=True):
        try:
            rank, command = process.environ().get("HOROVOD_RANK"), process.cmdline()
        except psutil.NoSuchProcess:  # gone, or a zombie
            continue
        if rank is not None:
            found.append((process, rank, command))
    return found


def wait_for(condition, job: subprocess.Popen, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert job.poll() is None, f"the job ended early:\n{job.stdout.read()}"
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def failed_job(*arguments: str, code: int = 2) -> str:
    """`horovodrun -np 2 --gloo python -m hvd_train ARGUMENTS`, which must fail cleanly: with
    exit code `code`, hvd_train's one error line said once (by rank 0), horovodrun's one-line
    summary naming the rank that ended the job, and no traceback anywhere. The error line."""
    command = [str(HOROVODRUN), "-np", "2", "--gloo", sys.executable, "-m", "hvd_train",
               *arguments]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT)
    output = result.stdout + result.stderr
    assert result.returncode == code and "Traceback" not in output, output
    lines = [line for line in output.splitlines() if "hvd-train: error:" in line]
    assert [line.split(":", 1)[0] for line in lines] == ["[0]<stderr>"], output
    summary = f"horovodrun: rank [01] exited with code {code}; the job was stopped"
    assert re.fullmatch(summary, result.stderr.splitlines()[-1]), output
    return lines[0].split(":", 1)[1]


def assert_no_tensorflow_banners(output: str) -> None:
    """None of what TensorFlow's C++ side prints as it loads (absl's and oneDNN's notices)."""
    for banner in ("absl::InitializeLog", "oneDNN custom operations", "cpu_feature_guard"):
        assert banner not in output, output


def script(name: str) -> str:
    """The path of tests/jobs/`name`, a script a test starts."""
    return str(JOBS / name)


def alone(*arguments: str) -> subprocess.CompletedProcess:
    """`python ARGUMENTS...` as a single process, without horovodrun (world size 1)."""
    command = [sys.executable, *arguments]
    return subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT, check=True)
