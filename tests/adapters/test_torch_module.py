"""The torch adapter's module, in one process of its own (module_modes.py says what it checks)."""

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.torch


def test_each_pass_runs_in_the_mode_it_asks_for():
    script = Path(__file__).with_name("module_modes.py")
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True)
    assert result.returncode == 0 and result.stdout.strip() == "OK", result.stderr[-3000:]
