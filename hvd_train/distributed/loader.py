"""One rank's batches of a dataset: the one batching path of hvd_train, which a loop of one's
own iterates (the framework's tensors, batch by batch), and hvd_train's trainer, `hvd-train
bench` and evaluation step through (NumPy batches, a step's at a time). Worker threads read
ahead, the transforms apply, each rank takes a disjoint slice in equal step counts, and orders
and seeds derive from the seed and the epoch (`data/order.py`, `data/pipeline.py`)."""

from __future__ import annotations

import math
from collections.abc import Generator, Iterator, Sequence
from contextlib import closing
from typing import Any

import numpy as np

from hvd_train.data.base import ArrayDataset, Dataset
from hvd_train.data.hugging_face import hugging_face, is_hugging_face
from hvd_train.data.order import epoch_order, eval_slice, rank_steps, step_seed, steps_per_epoch
from hvd_train.data.pipeline import Taken, augmentation, read_ahead, workers_for
from hvd_train.data.transforms import Transformed, Transforms, parse_transforms
from hvd_train.distributed.backend import Backend
from hvd_train.errors import UsageError


def as_dataset(data: Any) -> Dataset:
    """What a loop hands over as a dataset: a `(inputs, labels)` pair of arrays, a Hugging
    Face dataset, or any object with `len()` whose `[indices]` gives `(inputs, labels)`."""
    if isinstance(data, tuple | list) and len(data) == 2 and hasattr(data[0], "__len__"):
        x, y = data
        return ArrayDataset(x if isinstance(x, dict) else np.asarray(x), np.asarray(y))
    if is_hugging_face(data):
        return hugging_face(data, "the loader's dataset")
    if hasattr(data, "__len__") and hasattr(data, "__getitem__"):
        return data
    raise UsageError(
        f"loader: the dataset is a {type(data).__name__}; give (inputs, labels) arrays, a "
        "Hugging Face dataset, or an object with len() whose [indices] gives (inputs, labels)"
    )


class Loader:
    """This rank's batches of `dataset`.

    Training (`shuffle`): each epoch the examples in an order drawn from (seed, epoch), every
    rank a disjoint slice of it in as many steps as the others (of `passes` batches each, at
    most `limit` steps an epoch), and the framework's dropout seeded before each batch from
    (seed, step, rank), so that a resumed loop draws the numbers the uninterrupted loop drew.
    Evaluation: each rank a contiguous slice, every example once.
    `set_epoch(epoch, step)` says which epoch the next iteration reads, from which step."""

    def __init__(self, backend: Backend, dataset: Any, batch_size: int, *, shuffle: bool,
                 seed: int, workers: int | str, prefetch: int,
                 transforms: Sequence[dict[str, Any]] | Transforms, timeout: float,
                 threads: int, passes: int = 1, limit: int | None = None) -> None:  # fmt: skip
        if not (type(batch_size) is int and batch_size > 0):
            raise UsageError(f"loader: batch_size must be a positive integer, got {batch_size!r}")
        self.backend, self.batch_size, self.shuffle, self.seed = backend, batch_size, shuffle, seed
        parsed = transforms if isinstance(transforms, Transforms) else parse_transforms(transforms)
        self.transforms, self.passes = parsed, passes
        dataset = as_dataset(dataset)
        self.dataset = dataset if shuffle or not parsed.evaluation else Transformed(
            dataset, parsed.evaluation
        )  # fmt: skip
        self.workers = workers_for(workers, dataset, threads)
        self.prefetch, self.timeout = prefetch, timeout
        self.epoch, self.first = 0, 0
        size, rank, world = len(dataset), backend.rank, backend.world_size
        self.mine = None if shuffle else eval_slice(size, rank, world)
        steps = (steps_per_epoch(size, world, batch_size, passes) if self.mine is None
                 else math.ceil(len(self.mine) / batch_size))  # fmt: skip
        self.steps = min(steps, limit or steps)

    @property
    def global_batch(self) -> int:
        """Examples per step across the ranks."""
        return self.batch_size * self.passes * self.backend.world_size

    def set_epoch(self, epoch: int, step: int = 0) -> None:
        """The next iteration reads epoch `epoch` from its step `step` on (a resumed loop's)."""
        self.epoch, self.first = epoch, step

    def __len__(self) -> int:
        return self.steps

    def step_seed(self, index: int) -> int:
        """The random numbers of step `index` of the epoch on this rank (its first batch's
        dropout; batch k's is this plus k)."""
        return step_seed(self.seed, self.epoch * self.steps + index, self.backend.rank)

    def _indices(self) -> list[list[np.ndarray]]:
        if self.mine is not None:
            return [[self.mine[first : first + self.batch_size]]
                    for first in range(0, len(self.mine), self.batch_size)]  # fmt: skip
        order = epoch_order(len(self.dataset), self.seed, self.epoch)
        steps = rank_steps(order, self.backend.rank, self.backend.world_size, self.batch_size,
                           self.passes)  # fmt: skip
        return steps[: self.steps]

    def step_batches(self) -> Generator[Taken, None, None]:
        """The epoch's steps from the one `set_epoch` named, each its `passes` batches as NumPy
        `(inputs, labels)`, read ahead; what `Distributed.exchange.step` takes. Closing it
        (or reading it to its end) stops the workers."""
        first, self.first = self.first, 0
        augment = augmentation(self.transforms, self.seed, self.epoch) if self.shuffle else None
        yield from read_ahead(self.dataset, self._indices()[first:], self.workers,
                              self.prefetch, augment, self.timeout)  # fmt: skip

    def __iter__(self) -> Iterator[tuple[Any, Any]]:
        """The batches, one by one, as the framework's tensors on the device (images
        channels-first under torch)."""
        first = self.first
        with closing(self.step_batches()) as steps:
            for index, taken in enumerate(steps, start=first):
                for pass_index, (x, y) in enumerate(taken):
                    if self.shuffle:
                        self.backend.reseed(self.step_seed(index) + pass_index)
                    yield self.backend.tensors(x, y)
