import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
HOROVODRUN = Path(sys.executable).parent / "horovodrun"
TIMEOUT = 600


def horovodrun(script: str, *arguments: str, np: int = 2) -> subprocess.CompletedProcess:
    """`horovodrun -np N python tests/multiprocess/SCRIPT ARGS`, with a hard timeout."""
    command = [str(HOROVODRUN), "-np", str(np), sys.executable, str(HERE / script), *arguments]
    result = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT)
    if result.returncode != 0:
        pytest.fail(
            f"{' '.join(command)} exited {result.returncode}:\n{result.stdout}\n{result.stderr}"
        )
    return result


def alone(script: str, *arguments: str) -> subprocess.CompletedProcess:
    """The same script as a single process, without horovodrun (world size 1)."""
    command = [sys.executable, str(HERE / script), *arguments]
    return subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT, check=True)
