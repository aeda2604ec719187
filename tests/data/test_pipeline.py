"""Reading ahead: the same batches in the same order with any number of workers, a source's
error raised in the step that needs the batch, a batch that never comes raised after the
timeout, the threads gone once the epoch is left."""

import sys
import threading
import time

import numpy as np
import pytest

from hvd_train.data import ArrayDataset
from hvd_train.data.order import epoch_order, rank_steps
from hvd_train.data.pipeline import read_ahead, workers_for
from hvd_train.errors import DataStalled


class SlowSource:
    """A source whose every read waits `wait` seconds, as network storage makes it."""

    def __init__(self, size: int, wait: float, broken: int | None = None) -> None:
        self.x = np.arange(size * 3, dtype=np.float32).reshape(size, 3)
        self.y = np.arange(size) % 10
        self.wait, self.broken = wait, broken
        self.lock, self.reading, self.most_at_once = threading.Lock(), 0, 0

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, indices: np.ndarray):
        with self.lock:
            self.reading += 1
            self.most_at_once = max(self.most_at_once, self.reading)
        time.sleep(self.wait)
        with self.lock:
            self.reading -= 1
        if self.broken is not None and self.broken in indices:
            raise OSError(f"example {self.broken}: unreadable")
        return self.x[indices], self.y[indices]


def steps_of(size: int, passes: int = 1) -> list:
    return rank_steps(epoch_order(size, 42, 0), 1, 2, 8, passes)


@pytest.mark.parametrize("workers", [0, 1, 3])
@pytest.mark.parametrize("passes", [1, 2])
def test_any_number_of_workers_gives_the_batches_of_the_step_in_order(workers, passes):
    source, steps = SlowSource(200, 0.0), steps_of(200, passes)
    taken = list(read_ahead(source, steps[2:], workers, prefetch=2))
    assert len(taken) == len(steps) - 2
    for step, batches in zip(steps[2:], taken, strict=True):
        assert len(batches) == passes
        for indices, (x, y) in zip(step, batches, strict=True):
            np.testing.assert_array_equal(x, source.x[indices])
            assert y.dtype == np.int64 and (y == source.y[indices]).all()


def test_workers_read_several_batches_at_once():
    source, steps = SlowSource(400, 0.02), steps_of(400)
    for _ in read_ahead(source, steps, workers=4, prefetch=4):
        pass
    assert source.most_at_once >= 3, source.most_at_once


def test_the_step_waits_less_for_pythons_lock_while_workers_read():
    before = sys.getswitchinterval()
    reading = read_ahead(SlowSource(64, 0.0), steps_of(64), workers=2, prefetch=2)
    next(reading)
    assert sys.getswitchinterval() <= 0.0005 < before
    reading.close()
    assert sys.getswitchinterval() == before


def test_a_failing_read_is_raised_by_the_step_that_needs_it():
    steps = steps_of(200)
    broken = int(steps[5][0][0])
    batches = read_ahead(SlowSource(200, 0.0, broken), steps, workers=2, prefetch=2)
    for _ in range(5):
        next(batches)
    with pytest.raises(OSError, match=f"example {broken}: unreadable"):
        next(batches)


class Hanging(SlowSource):
    """A source whose read of one example takes `hang` seconds, as a stalled mount does."""

    def __init__(self, size: int, stalled: int, hang: float) -> None:
        super().__init__(size, 0.0)
        self.stalled, self.hang = stalled, hang

    def __getitem__(self, indices: np.ndarray):
        if self.stalled in indices:
            time.sleep(self.hang)
        return super().__getitem__(indices)


def test_a_batch_that_never_comes_is_raised_after_the_timeout():
    steps = steps_of(200)
    stalled = int(steps[4][0][1])
    batches = read_ahead(Hanging(200, stalled, 5.0), steps, workers=2, prefetch=2, timeout=0.5)
    for _ in range(4):
        next(batches)
    started = time.monotonic()
    with pytest.raises(DataStalled, match=rf"no batch in 0.5 s \(the batch of examples "
                       rf"{steps[4][0][0]}, {stalled}, "):  # fmt: skip
        next(batches)
    assert time.monotonic() - started < 2
    # A slow read within the timeout is only waited for.
    slow = read_ahead(Hanging(200, stalled, 0.3), steps, workers=2, prefetch=2, timeout=2.0)
    assert len(list(slow)) == len(steps)


def readers() -> set[threading.Thread]:
    """Grain's reading threads and the one handing their batches over (pytest-xdist runs
    threads of its own beside the tests)."""
    return {thread for thread in threading.enumerate()
            if thread.name.startswith(("grain", "hvd_train"))}  # fmt: skip


def test_leaving_an_epoch_early_or_at_its_end_stops_its_threads():
    before = readers()
    batches = read_ahead(SlowSource(400, 0.01), steps_of(400), workers=3, prefetch=3)
    next(batches)
    # The pool starts a thread per read only while none of its own is idle: up to `workers`.
    started = sorted(thread.name for thread in readers() - before)
    assert started[-1] == "hvd_train-handover" and 2 <= len(started) <= 4, started
    batches.close()
    deadline = time.monotonic() + 5
    while readers() - before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not readers() - before
    list(read_ahead(SlowSource(400, 0.0), steps_of(400), workers=3, prefetch=3))
    deadline = time.monotonic() + 5
    while readers() - before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not readers() - before  # an epoch read to its end leaves no thread either


def test_auto_reads_arrays_in_memory_in_the_step_and_anything_else_ahead(tmp_path):
    in_memory = ArrayDataset(np.zeros((10, 2)), np.zeros(10, dtype=np.int64))
    assert workers_for("auto", in_memory, cores=4) == 0
    mapped = np.lib.format.open_memmap(tmp_path / "x.npy", "w+", np.float32, (10, 2))
    assert workers_for("auto", ArrayDataset(np.asarray(mapped), np.zeros(10)), cores=4) == 4
    assert workers_for("auto", SlowSource(10, 0.0), cores=1) == 2
    assert workers_for("auto", SlowSource(10, 0.0), cores=64) == 8
    assert workers_for(3, in_memory, cores=4) == 3
