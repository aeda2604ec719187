"""A rank's batches of an epoch, read ahead of the step by worker threads (Grain).

The trainer knows every batch's indices before the epoch starts (`order.rank_steps`), so
the batches can be taken while the steps before them run: `workers` threads each take whole
batches (`take`: read, decode, cast), up to `prefetch` batches ahead, and hand them over in
order. Which examples a batch holds never depends on the workers, so a run reads the same with
any setting, and a resumed run starts the reading at its step. Threads suit waiting on storage
and decoders that let go of Python's lock (NumPy's, OpenCV's). Why Grain: docs/data.md.
"""

from __future__ import annotations

import functools
import logging
import queue
import sys
import threading
from collections.abc import Callable, Generator, Iterator, Sequence
from typing import Any

import numpy as np

from hvd_train.data.base import ArrayDataset, Dataset, on_disk, take
from hvd_train.data.transforms import Transforms, apply
from hvd_train.errors import DataStalled

SWITCH_INTERVAL_S = 0.0005
DEFAULT_TIMEOUT = 300.0  # seconds without a batch before a source counts as hung
Step = list[np.ndarray]  # a step's batches of indices, one per backward pass
Taken = list[tuple[Any, Any]]  # the step's batches, taken


def workers_for(setting: int | str, dataset: Dataset, cores: int) -> int:
    """The threads that read ahead: the setting, or for "auto" none where the examples are
    arrays in memory (taking a batch is a copy, which a hand-over would only add to), else one
    per core of the rank's share (`cores`), at least two and at most eight."""
    if setting != "auto":
        return int(setting)
    if isinstance(dataset, ArrayDataset) and not on_disk(dataset.x):
        return 0
    return max(2, min(8, cores))


Augment = Callable[[Any, np.ndarray], Any]  # a batch's inputs and its examples -> inputs


def read_ahead(
    dataset: Dataset, steps: Sequence[Step], workers: int, prefetch: int,
    augment: Augment | None = None, timeout: float = DEFAULT_TIMEOUT,
) -> Generator[Taken, None, None]:  # fmt: skip
    """The steps' batches, taken (and their inputs augmented), in order: in the caller's thread
    when `workers` is 0, else by `workers` threads up to `prefetch` steps ahead. Closing the
    generator (or reading it to its end) stops the threads. A batch the threads have not read
    after `timeout` seconds raises DataStalled."""
    if workers == 0:
        for step in steps:
            yield take_step(dataset, step, augment)
        return
    grain = _grain()
    source = grain.MapDataset.source(steps).map(lambda step: take_step(dataset, step, augment))
    options = grain.ReadOptions(num_threads=workers, prefetch_buffer_size=prefetch)
    iterator = iter(source.to_iter_dataset(options))
    # The step's thread waits for Python's lock while a worker runs Python code (a decoder's),
    # up to the switch interval after each framework call: 5 ms by default, shortened while the
    # workers read (docs/data.md, "Decoding").
    interval = sys.getswitchinterval()
    sys.setswitchinterval(min(interval, SWITCH_INTERVAL_S))
    try:
        yield from _within(timeout, iterator, steps)
    finally:
        sys.setswitchinterval(interval)
        iterator.close()


def _within(timeout: float, iterator: Iterator[Taken], steps: Sequence[Step]) -> Iterator[Taken]:
    """`iterator`'s batches, each waited for `timeout` seconds at most. A thread of its own
    takes them from Grain's iterator (whose `next` has no timeout) and hands them over, one at
    a time; it ends with the iterator, or once this generator is closed. Besides Grain's
    `prefetch`, it holds two: the one handed over and the next it waits to hand."""
    handed: queue.Queue[tuple[Taken | None, BaseException | None]] = queue.Queue(maxsize=1)
    closed = threading.Event()

    def hand(item: tuple[Taken | None, BaseException | None]) -> None:
        while not closed.is_set():
            try:
                return handed.put(item, timeout=0.1)
            except queue.Full:
                pass

    def hand_over() -> None:
        try:
            for taken in iterator:
                hand((taken, None))
                if closed.is_set():
                    return
            hand((None, None))
        except BaseException as error:  # raised by a read: the step that needs it raises it
            hand((None, error))

    threading.Thread(target=hand_over, name="hvd_train-handover", daemon=True).start()
    try:
        for step in steps:
            try:
                taken, error = handed.get(timeout=timeout)
            except queue.Empty:
                first = ", ".join(str(int(i)) for i in step[0][:4])
                raise DataStalled(
                    f"the data workers read no batch in {timeout:g} s (the batch of examples "
                    f"{first}, ...): the source hangs or is far too slow; check its storage, "
                    "or give it longer with --set data.timeout=SECONDS"
                ) from None
            if error is not None:
                raise error
            if taken is None:
                return
            yield taken
    finally:
        closed.set()


def augmentation(transforms: Transforms, seed: int, epoch: int) -> Augment | None:
    """The training transforms for epoch `epoch`, each example drawing from (seed, epoch, its
    index); None without any."""
    if not transforms.training:
        return None
    return functools.partial(apply, transforms.training, seed=seed, epoch=epoch,
                             random=transforms.random)  # fmt: skip


def take_step(dataset: Dataset, step: Step, augment: Augment | None = None) -> Taken:
    taken = [take(dataset, indices) for indices in step]
    if augment is None:
        return taken
    return [(augment(x, indices), y) for (x, y), indices in zip(taken, step, strict=True)]


def _grain() -> Any:
    # Grain's import logs that JAX's profiler is missing (through absl): nothing a user needs.
    logger = logging.getLogger("absl")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        import grain
    finally:
        logger.setLevel(level)
    return grain
