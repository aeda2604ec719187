"""What many tests do alike: run hvd_train in one process, read what a run saved, and compare two
runs' weights bit for bit. (Jobs under horovodrun: tests/horovodrun.py.)"""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file

from hvd_train.distributed.checkpoint_files import checkpoint_name


def hvd_train(
    *arguments: str, env: dict[str, str] | None = None, timeout: float = 600
) -> subprocess.CompletedProcess:
    """`python -m hvd_train ARGUMENTS...` as one process (world size 1), with a hard timeout;
    its exit code is the caller's to check."""
    command = [sys.executable, "-m", "hvd_train", *arguments]
    environment = os.environ | (env or {})
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                          env=environment)  # fmt: skip


def evaluation(checkpoint: Path, *arguments: str) -> dict:
    """`hvd-train eval --json` of `checkpoint` in one process: the object it prints."""
    result = hvd_train("eval", "--checkpoint", str(checkpoint), "--json", *arguments)
    assert result.returncode == 0, result.stdout + result.stderr
    return json.loads(result.stdout.splitlines()[-1])


def saved_weights(
    run: Path, epoch: int, step: int = 0, kept: str = "model.safetensors"
) -> dict[str, np.ndarray]:
    """The weights `run` saved at `epoch` (and `step` into it), by neutral name (or what else
    it `kept`: the optimizer's state)."""
    return load_file(run / "checkpoints" / checkpoint_name(epoch, step) / kept)


def assert_same_weights(expected: dict[str, np.ndarray], actual: dict[str, np.ndarray]) -> None:
    """Bit for bit, tensor by tensor."""
    assert expected and expected.keys() == actual.keys()
    different = [name for name in expected if not np.array_equal(expected[name], actual[name])]
    assert different == [], different
