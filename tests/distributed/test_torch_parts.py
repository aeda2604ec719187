"""Parts of the torch dist, each in one process of its own (each script says what it
checks, and prints OK)."""

import subprocess
import sys

import pytest

from tests.horovodrun import script

pytestmark = pytest.mark.torch


def run_script(name: str) -> None:
    path = script(name)
    result = subprocess.run([sys.executable, path], capture_output=True, text=True)
    assert result.returncode == 0 and result.stdout.strip() == "OK", result.stderr[-3000:]


def test_gradients_live_in_one_buffer_in_their_parameters_layout():
    run_script("exchange_views.py")


def test_each_pass_runs_in_the_mode_it_asks_for():
    run_script("module_modes.py")
