"""The patched background loop under stress, each case a short job under the real horovodrun
with a hard timeout; cycle_stress.py checks every result against the one-process answer."""

import json
import re

import pytest

from tests.horovodrun import horovodrun, script

pytestmark = [pytest.mark.multiprocess, pytest.mark.torch, pytest.mark.timeout(300)]

SCRIPT = script("horovod/cycle_stress.py")
GLOO_TIMEOUT = ["--gloo", "--gloo-timeout-seconds", "2"]  # the late rank sleeps 4 s


def run(scenario: str, options: list[str]) -> dict:
    result = horovodrun(SCRIPT, scenario, horovodrun_options=options, timeout=120)
    match = re.search(rf"ok {scenario} (\{{.*\}})", result.stdout)
    assert match, result.stdout + result.stderr
    return json.loads(match.group(1))


# What rank 0 reports once every result on the way matched the one-process answer.
REPORTS = {"alternating": {"steps": 500}, "uneven-join": {"last_to_join": 1},
           "threads": {"allreduces": 400}}  # fmt: skip


@pytest.mark.parametrize("scenario", REPORTS)
def test_scenario(scenario):
    assert run(scenario, ["--gloo"]) == REPORTS[scenario]


def test_twenty_restarts_each_shut_down_within_half_a_second():
    assert run("restarts", ["--gloo"])["slowest_shutdown_s"] < 0.5


# The idle case (a rank with nothing to do) under each setting that changes how the loop runs:
# autotuning turns the event-driven wait off; no response cache makes every cycle negotiate in
# full; cycle time 0 starts a busy rank's next cycle at once.
SETTINGS = {
    "default": [],
    "no response cache": ["--cache-capacity", "0"],
    "autotune": ["--autotune"],
    "cycle time 0": ["--cycle-time-ms", "0"],
}


@pytest.mark.parametrize("setting", SETTINGS)
def test_a_rank_late_past_gloos_timeout_is_waited_for(setting):
    measured = run("late-rank", GLOO_TIMEOUT + SETTINGS[setting])
    assert measured["waited_s"] < 30


def test_the_timeline_marks_cycles_while_a_rank_is_late(tmp_path):
    timeline = tmp_path / "timeline.json"
    options = ["--timeline-filename", str(timeline), "--timeline-mark-cycles"]
    run("late-rank", GLOO_TIMEOUT + options)
    text = timeline.read_text()
    assert "CYCLE_START" in text and '"allreduce.late"' in text
