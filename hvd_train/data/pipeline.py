"""A rank's batches of an epoch, read ahead of the step by worker threads (Grain).

The trainer knows every batch's indices before the epoch starts (`sharding.shard_steps`), so
the batches can be taken while the steps before them run: `workers` threads each take whole
batches (`take`: read, decode, cast), up to `prefetch` batches ahead, and hand them over in
order. Which examples a batch holds never depends on the workers, so a run reads the same with
any setting, and a resumed run starts the reading at its step. Threads suit waiting on storage
and decoders that let go of Python's lock (NumPy's, Pillow's). Why Grain: docs/data.md.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Generator, Sequence
from typing import Any

import numpy as np

from hvd_train.data.base import ArrayDataset, Dataset, take
from hvd_train.data.transforms import Transform, apply

Step = list[np.ndarray]  # a step's batches of indices, one per backward pass
Taken = list[tuple[Any, Any]]  # the step's batches, taken


def workers_for(setting: int | str, dataset: Dataset, cores: int) -> int:
    """The threads that read ahead: the setting, or for "auto" none where the examples are
    arrays in memory (taking a batch is a copy, which a hand-over would only add to), else one
    per core of the rank's share (`cores`), at least two and at most eight."""
    if setting != "auto":
        return int(setting)
    if isinstance(dataset, ArrayDataset) and not _on_disk(dataset.x):
        return 0
    return max(2, min(8, cores))


def _on_disk(array: Any) -> bool:
    return isinstance(array, np.memmap) or isinstance(getattr(array, "base", None), np.memmap)


Augment = Callable[[Any, np.ndarray], Any]  # a batch's inputs and its examples -> inputs


def read_ahead(
    dataset: Dataset, steps: Sequence[Step], workers: int, prefetch: int,
    augment: Augment | None = None,
) -> Generator[Taken, None, None]:  # fmt: skip
    """The steps' batches, taken (and their inputs augmented), in order: in the caller's thread
    when `workers` is 0, else by `workers` threads up to `prefetch` steps ahead. Closing the
    generator (or reading it to its end) stops the threads."""
    if workers == 0:
        for step in steps:
            yield take_step(dataset, step, augment)
        return
    grain = _grain()
    source = grain.MapDataset.source(steps).map(lambda step: take_step(dataset, step, augment))
    options = grain.ReadOptions(num_threads=workers, prefetch_buffer_size=prefetch)
    iterator = iter(source.to_iter_dataset(options))
    try:
        yield from iterator
    finally:
        iterator.close()


def augmentation(training: Sequence[Transform], seed: int, epoch: int) -> Augment | None:
    """The training transforms for epoch `epoch`, each example drawing from (seed, epoch, its
    index); None without any."""
    if not training:
        return None
    return functools.partial(apply, training, seed=seed, epoch=epoch)


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
