"""The patched launcher names the real cause of a failed job: `horovod.run` raises the first
rank's exception to fail, or a JobFailed naming one it cannot rebuild, under static and elastic
launches (a killed worker beside the elastic driver's reason to stop); horovodrun ends a job
whose other rank hangs within about 10 s, in one line naming a rank that was killed; a bad
grace-time setting is one line before anything starts.
failing_jobs.py holds the jobs."""

import json
import os
import re
import subprocess
import sys
import time

import pytest

from tests.horovodrun import HOROVODRUN, script

pytestmark = [pytest.mark.multiprocess, pytest.mark.torch, pytest.mark.timeout(300)]

SCRIPT = script("horovod/failing_jobs.py")


def caller(case: str, **environment: str) -> dict[str, str]:
    """`horovod.run` of `case` from a fresh Python: what reached the caller, line by line."""
    result = subprocess.run([sys.executable, SCRIPT, "run", case], capture_output=True,
                            text=True, timeout=240, env=os.environ | environment)  # fmt: skip
    lines = dict(line.split(" ", 1) for line in result.stdout.splitlines() if " " in line)
    assert result.returncode == 0 and "raised" in lines, result.stdout + result.stderr
    return lines | {"output": result.stdout + result.stderr}


def test_the_first_rank_to_fail_names_the_cause():
    # Rank 1 raises while rank 0 waits in an allreduce, which then fails on rank 0 as well.
    seen = caller("first-failure")
    assert seen["raised"] == "ValueError: rank 1 found a mistake", seen["output"]
    [note] = json.loads(seen["notes"])
    assert note.startswith("rank 1's traceback:\nTraceback") and "second_rank_fails_first" in note
    assert note.endswith("ValueError: rank 1 found a mistake")


def test_an_exception_that_cannot_be_rebuilt_comes_back_as_job_failed():
    seen = caller("two-arguments")
    assert seen["raised"] == (
        "JobFailed: rank 1 raised __main__.TwoArguments: a mistake at step 3"
    ), seen["output"]
    assert seen["error_type"] == "__main__.TwoArguments"
    remote = json.loads(seen["remote_traceback"])
    assert "in second_rank_raises_two_arguments" in remote
    assert remote.endswith("TwoArguments: a mistake at step 3")


def test_an_elastic_job_hands_its_rank_s_exception_back(tmp_path):
    discovery = tmp_path / "discover.sh"
    discovery.write_text("#!/bin/sh\necho localhost:2\n")
    discovery.chmod(0o755)
    seen = caller("elastic", DISCOVERY_SCRIPT=str(discovery))
    assert seen["raised"] == "ValueError: rank 1 found a mistake under elastic", seen["output"]


def test_a_killed_elastic_worker_keeps_the_drivers_reason_to_stop(tmp_path):
    from horovod.runner.elastic.constants import RESET_LIMIT_EXCEEDED_MESSAGE

    discovery = tmp_path / "discover.sh"
    discovery.write_text("#!/bin/sh\nprintf 'localhost:1\\n127.0.0.1:1\\n'\n")
    discovery.chmod(0o755)
    seen = caller("elastic-killed", DISCOVERY_SCRIPT=str(discovery))
    killed = r"process [\w.]+\[0\] exited with code 137 without raising an exception"
    reason = re.escape(RESET_LIMIT_EXCEEDED_MESSAGE.format(0))
    assert re.fullmatch(f"JobFailed: {reason}; {killed}", seen["raised"]), seen["output"]


def test_a_grace_time_that_is_not_a_number_is_one_line_before_any_rank_starts():
    seen = caller("grace-time", HOROVOD_GRACEFUL_TERMINATION_TIME_S="soon")
    assert seen["raised"] == (
        "BadSetting: HOROVOD_GRACEFUL_TERMINATION_TIME_S must be a number of seconds, such as "
        "25, not 'soon'; set it so or unset it"
    )
    command = [str(HOROVODRUN), "-np", "2", "--gloo", sys.executable, "-c", "pass"]
    environment = os.environ | {"HOROVOD_GRACEFUL_TERMINATION_TIME_S": "nan"}
    result = subprocess.run(command, capture_output=True, text=True, timeout=60, env=environment)
    assert result.returncode == 2 and result.stdout == "", result.stdout + result.stderr
    assert result.stderr.splitlines() == [
        "horovodrun: HOROVOD_GRACEFUL_TERMINATION_TIME_S must be a number of seconds, such as "
        "25, not 'nan'; set it so or unset it"
    ]


def horovodrun_job(case: str) -> tuple[subprocess.CompletedProcess, float]:
    command = [str(HOROVODRUN), "-np", "2", "--gloo", sys.executable, SCRIPT, case]
    started = time.monotonic()
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    return result, time.monotonic() - started


def test_a_failed_job_whose_other_rank_hangs_ends_within_about_ten_seconds():
    # Rank 1 exits with code 3 after 0.5 s; rank 0 ignores SIGTERM and sleeps for 300 s.
    result, took = horovodrun_job("hang")
    assert result.returncode == 3, result.stdout + result.stderr
    assert result.stderr.splitlines()[-1] == (
        "horovodrun: rank 1 exited with code 3; the job was stopped"
    )
    # Start-up, 0.5 s, 5 s to exit alone, 3 s after SIGTERM: about 10 s, not rank 0's 300 s
    # (the bound leaves room for a loaded machine: 16 s in a CI run beside other tests).
    assert took < 30, took


def test_a_rank_killed_by_sigkill_is_named_as_such():
    result, _ = horovodrun_job("oom")
    assert result.returncode == 128 + 9, result.stdout + result.stderr
    assert re.fullmatch(
        r"horovodrun: rank 1 was killed by SIGKILL \(out of memory\?\); the job was stopped",
        result.stderr.splitlines()[-1],
    ), result.stderr


def test_the_first_exception_is_first_by_the_launchers_clock():
    # Rank 1 raises first on a clock 1,000 s ahead; rank 0 raises a second later.
    seen = caller("clocks")
    assert seen["raised"] == "ValueError: rank 1 raised first", seen["output"]


@pytest.mark.tensorflow
def test_a_peers_shut_down_error_under_tensorflow_ranks_after_the_cause():
    # Rank 1 shuts Horovod down and raises 2 s later; rank 0's allreduce fails first, with
    # TensorFlow's own error of Horovod's shut-down.
    seen = caller("tensorflow")
    assert seen["raised"] == "ValueError: rank 1 found a mistake under TensorFlow", seen["output"]


@pytest.fixture
def store():
    """Horovod's key-value store, as horovod.run's launcher serves it to the ranks."""
    from horovod.runner.http.http_server import KVStoreServer

    server = KVStoreServer(verbose=0)
    port = server.start_server()
    yield "127.0.0.1", port
    server.shutdown_server()


def test_under_elastic_the_worker_that_died_is_named_not_one_that_raised(store, monkeypatch):
    # Elastic launches name processes host[slot]: hostA[0] raised what a waiting rank sees,
    # hostB[0] was killed without raising.
    from horovod.common.exceptions import HorovodInternalError, JobFailed
    from horovod.runner.run_task import put_function_error, raise_function_error

    monkeypatch.setenv("HOROVOD_HOSTNAME", "hostA")
    monkeypatch.setenv("HOROVOD_LOCAL_RANK", "0")
    try:
        raise HorovodInternalError("the allreduce failed")
    except HorovodInternalError as error:
        put_function_error(*store, 0, error)
    exits = [("hostA[0]", 1), ("hostB[0]", -9)]
    with pytest.raises(JobFailed) as raised:
        raise_function_error(*store, range(2), JobFailed("", 1, rank="hostA[0]", exits=exits))
    assert str(raised.value) == "process hostB[0] exited with code -9 without raising an exception"
    assert raised.value.summary() == "process hostB[0] was killed by SIGKILL (out of memory?)"


def test_the_elastic_drivers_reason_to_stop_leads_the_message():
    from horovod.common.exceptions import JobFailed
    from horovod.runner.elastic.constants import RESET_LIMIT_EXCEEDED_MESSAGE
    from horovod.runner.gloo_run import _raise_first_failure

    reason = RESET_LIMIT_EXCEEDED_MESSAGE.format(0)
    # The worker the driver stopped exited non-zero after the failure that made it stop.
    with pytest.raises(JobFailed) as raised:
        _raise_first_failure({"hostA[0]": (143, 2.0)}, reason)
    stopped = "the first process to exit non-zero was hostA[0], with code 143"
    assert str(raised.value) == f"{reason}; {stopped}"
    assert raised.value.driver_message == reason
