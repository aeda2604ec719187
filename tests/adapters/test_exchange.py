"""The torch exchange's flat buffer, in one process of its own (exchange_views.py says what
it checks)."""

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.torch


def test_gradients_live_in_one_buffer_in_their_parameters_layout():
    script = Path(__file__).with_name("exchange_views.py")
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True)
    assert result.returncode == 0 and result.stdout.strip() == "OK", result.stderr[-3000:]
