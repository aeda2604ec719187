"""Jobs that fail in the ways the patched launcher must name: functions that `horovod.run` sends
to its ranks (`python failing_jobs.py run CASE`, which prints what the caller got), and processes
that horovodrun starts (`python failing_jobs.py CASE`).

usage: failing_jobs.py run first-failure|two-arguments|elastic|grace-time|clocks|tensorflow
       failing_jobs.py hang|oom (under horovodrun -np 2)
"""

import json
import os
import signal
import sys
import time
from pathlib import Path


class TwoArguments(Exception):
    """An exception that pickles but does not unpickle: its constructor takes two arguments,
    and pickle rebuilds it from its `args`, which hold one."""

    def __init__(self, what: str, where: str) -> None:
        super().__init__(f"{what} at {where}")


def rank() -> int:
    return int(os.environ["HOROVOD_RANK"])


def second_rank_fails_first() -> None:
    """Rank 1 raises ValueError while rank 0 waits for it in an allreduce, which then fails on
    rank 0 too (HorovodInternalError): rank 1's is the cause."""
    import horovod.torch as hvd
    import torch

    hvd.init()
    if hvd.rank() == 1:
        raise ValueError("rank 1 found a mistake")
    hvd.allreduce(torch.ones(1), name="waits.for.rank.1")


def second_rank_raises_two_arguments() -> None:
    if rank() == 1:
        raise TwoArguments("a mistake", "step 3")


def elastic_second_rank_fails() -> None:
    """Under an elastic launch: rank 1 raises before the first commit."""
    import horovod.torch as hvd
    import torch

    hvd.init()

    @hvd.elastic.run
    def train(state) -> None:
        if hvd.rank() == 1:
            raise ValueError("rank 1 found a mistake under elastic")
        hvd.allreduce(torch.ones(1), name="elastic.waits")

    train(hvd.elastic.TorchState(step=0))


def elastic_second_rank_killed() -> None:
    """Under an elastic launch with a reset limit of 0: rank 1 is killed by SIGKILL while rank 0
    waits for it in an allreduce; the reset that would follow exceeds the limit."""
    import horovod.torch as hvd
    import torch

    hvd.init()

    @hvd.elastic.run
    def train(state) -> None:
        if hvd.rank() == 1:
            time.sleep(0.5)
            os.kill(os.getpid(), signal.SIGKILL)
        hvd.allreduce(torch.ones(1), name="elastic.waits")

    train(hvd.elastic.TorchState(step=0))


def ranks_raise_in_turn_on_clocks_apart() -> None:
    """Rank 1 raises at once, on a clock 1,000 s ahead (another host's, set wrong); rank 0 a
    second later: rank 1's is the first."""
    if rank() == 1:
        ahead = time.time() + 1000
        time.time = lambda: ahead
        raise ValueError("rank 1 raised first")
    time.sleep(1)
    raise RuntimeError("rank 0 raised second")


def tensorflow_second_rank_fails_after_shutting_down() -> None:
    """Rank 1 shuts Horovod down, then raises two seconds later; rank 0, waiting in an
    allreduce, meets TensorFlow's error of the shut-down first: rank 1's is the cause."""
    import horovod.tensorflow as hvd
    import tensorflow as tf

    hvd.init()
    if hvd.rank() == 1:
        hvd.shutdown()
        time.sleep(2)
        raise ValueError("rank 1 found a mistake under TensorFlow")
    hvd.allreduce(tf.ones(1), name="waits.for.rank.1")


def run(case: str) -> None:
    """Calls horovod.run for `case` and prints, in one line each, the exception that reached
    the caller (`raised TYPE: MESSAGE`), its notes and the attributes a JobFailed carries (as
    JSON), and how long the call took."""
    import horovod

    keywords: dict = {"np": 2, "use_gloo": True}
    if case.startswith("elastic"):
        discovery = Path(os.environ["DISCOVERY_SCRIPT"])
        # No --network-interface: the job is on this host alone.
        keywords |= {"min_np": 2, "max_np": 2, "host_discovery_script": str(discovery)}
    if case == "elastic-killed":  # two "hosts" (both this one): one goes on when the other fails
        keywords |= {"min_np": 1, "reset_limit": 0}
    function = {
        "first-failure": second_rank_fails_first,
        "two-arguments": second_rank_raises_two_arguments,
        "elastic": elastic_second_rank_fails,
        "elastic-killed": elastic_second_rank_killed,
        "grace-time": second_rank_raises_two_arguments,
        "clocks": ranks_raise_in_turn_on_clocks_apart,
        "tensorflow": tensorflow_second_rank_fails_after_shutting_down,
    }[case]
    started = time.monotonic()
    try:
        horovod.run(function, **keywords)
    except Exception as error:
        print(f"raised {type(error).__name__}: {error}")
        print(f"error_type {getattr(error, 'error_type', None)}")
        print("notes " + json.dumps(getattr(error, "__notes__", [])))
        print("remote_traceback " + json.dumps(getattr(error, "remote_traceback", None)))
    print(f"took {time.monotonic() - started:.1f}")


def process(case: str) -> None:
    """One rank of a job that horovodrun starts. hang: rank 1 exits with code 3 while rank 0
    ignores SIGTERM and sleeps; oom: rank 1 is killed by SIGKILL, as the kernel's OOM killer
    does, while rank 0 sleeps."""
    if rank() == 0:
        if case == "hang":
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        time.sleep(300)
    time.sleep(0.5)
    if case == "hang":
        sys.exit(3)
    os.kill(os.getpid(), signal.SIGKILL)


if __name__ == "__main__":
    if sys.argv[1] == "run":
        run(sys.argv[2])
    else:
        process(sys.argv[1])
