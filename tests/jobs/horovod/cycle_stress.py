"""Runs inside each rank under `horovodrun -np 2 --gloo` and puts the patched background loop
(a cycle as soon as a tensor is enqueued, none while a rank has nothing to do; see
docs/horovod-patch.md) through one hard case, checking every result against the one-process
answer.

usage: cycle_stress.py SCENARIO
Rank 0 prints one line, `ok SCENARIO {measurements as JSON}`; a wrong result raises.
"""

import json
import random
import sys
import threading
import time

import horovod.torch as hvd
import torch

LATE_SECONDS = 4.0  # past the 2 s Gloo timeout the test gives horovodrun


def value(rank: int, step: int) -> torch.Tensor:
    """What rank `rank` contributes at `step`: distinct per rank and step, exact in float32."""
    return torch.full((1000,), float(step * 10 + rank + 1))


def expect_sum(result: torch.Tensor, ranks: range, step: int) -> None:
    expected = sum(value(rank, step) for rank in ranks)
    assert torch.equal(result, expected), (step, result[0].item(), expected[0].item())


def late_rank() -> dict:
    """Rank 1 sleeps past Gloo's timeout before its allreduce, while rank 0 waits for the
    result: the idle rank's background loop must keep answering rank 0's cycles meanwhile."""
    started = time.perf_counter()
    if hvd.rank() == 1:
        time.sleep(LATE_SECONDS)
    handle = hvd.allreduce_async(value(hvd.rank(), 0), op=hvd.Sum, name="late")
    expect_sum(hvd.synchronize(handle), range(2), 0)
    waited = time.perf_counter() - started
    # Rank 0 counts from its own return from hvd.init, which may come a moment after rank 1's.
    assert waited >= LATE_SECONDS - 0.5, waited
    return {"waited_s": round(waited, 2)}


def alternating() -> dict:
    """500 steps; on even steps rank 0 enqueues first and rank 1 after a random sleep of up to
    40 ms (many of the waiting rank's cycles), on odd steps the other way round."""
    rng = random.Random(hvd.rank())
    for step in range(500):
        if step % 2 != hvd.rank():
            time.sleep(rng.uniform(0, 0.04))
        expect_sum(hvd.allreduce(value(hvd.rank(), step), op=hvd.Sum, name="step"), range(2), step)
    return {"steps": 500}


def uneven_join() -> dict:
    """Rank 0 has 5 steps and rank 1 has 50; after joining, rank 0 adds zeros to rank 1's sums."""
    steps = 5 if hvd.rank() == 0 else 50
    for step in range(steps):
        result = hvd.allreduce(value(hvd.rank(), step), op=hvd.Sum, name="uneven")
        expect_sum(result, range(2) if step < 5 else range(1, 2), step)
    last = hvd.join()
    assert last == 1, last
    return {"last_to_join": last}


def restarts() -> dict:
    """20 rounds of init, an allreduce and shutdown; each shutdown must take under 0.5 s."""
    slowest = 0.0
    for round_ in range(20):
        if round_:
            hvd.init()
        expect_sum(hvd.allreduce(value(hvd.rank(), round_), op=hvd.Sum, name="r"), range(2), round_)
        started = time.perf_counter()
        hvd.shutdown()
        slowest = max(slowest, time.perf_counter() - started)
    assert slowest < 0.5, slowest
    hvd.init()  # for the report
    return {"slowest_shutdown_s": round(slowest, 3)}


def threads() -> dict:
    """4 threads on each rank, each with 100 allreduces of its own names, in its own order."""
    failures: list[BaseException] = []

    def work(thread: int) -> None:
        try:
            for step in range(thread * 100, thread * 100 + 100):
                mine = value(hvd.rank(), step)
                expect_sum(hvd.allreduce(mine, op=hvd.Sum, name=f"thread.{step}"), range(2), step)
        except BaseException as error:  # reported by the main thread
            failures.append(error)

    workers = [threading.Thread(target=work, args=(thread,)) for thread in range(4)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert not failures, failures
    return {"allreduces": 400}


SCENARIOS = {
    "late-rank": late_rank,
    "alternating": alternating,
    "uneven-join": uneven_join,
    "restarts": restarts,
    "threads": threads,
}

if __name__ == "__main__":
    scenario = sys.argv[1]
    hvd.init()
    assert hvd.size() == 2, "run under horovodrun -np 2"
    measured = SCENARIOS[scenario]()
    if hvd.rank() == 0:
        print(f"ok {scenario} {json.dumps(measured)}", flush=True)
    hvd.shutdown()
