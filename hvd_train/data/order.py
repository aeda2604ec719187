"""Which examples each rank sees, in which order: every epoch an order drawn from the seed, each
rank a disjoint slice of it in equal step counts, and for evaluation a contiguous slice of the
examples, each counted once. (Sharding, in hvd_train, is only of the training state:
distributed/sharding.py.)"""

from __future__ import annotations

import math

import numpy as np

from hvd_train.errors import UsageError


def epoch_order(num_samples: int, seed: int, epoch: int) -> np.ndarray:
    """The epoch's shuffled sample order; every rank computes the same one from (seed, epoch)."""
    return np.random.default_rng([seed, epoch]).permutation(num_samples)


def step_seed(seed: int, global_step: int, rank: int) -> int:
    """The dropout seed of one step on one rank. Derived, not carried, so a resumed run draws
    exactly the numbers the uninterrupted run would have drawn."""
    return int(np.random.SeedSequence([seed, global_step, rank]).generate_state(1)[0])


def steps_per_epoch(num_samples: int, world_size: int, batch_size: int, passes: int = 1) -> int:
    """Optimizer steps per epoch, the same on every rank so none waits in a collective. Each
    step takes `passes` batches of at most `batch_size` on every rank (gradient accumulation)."""
    steps = math.ceil(math.ceil(num_samples / world_size) / (batch_size * passes))
    if num_samples // world_size < steps * passes:
        raise UsageError(
            f"{num_samples} samples cannot fill {steps * passes} batches on each of "
            f"{world_size} ranks; raise --batch-size or use fewer processes"
        )
    return steps


def rank_steps(
    order: np.ndarray, rank: int, world_size: int, batch_size: int, passes: int = 1
) -> list[list[np.ndarray]]:
    """This rank's steps for one epoch, each a list of `passes` batches of sample indices.

    Rank r takes every world_size-th sample of `order` starting at r, so the ranks' slices are
    disjoint and cover every sample. They differ in length by at most one; splitting each into
    the same number of near-equal batches (none larger than `batch_size`) keeps step counts
    equal, and an epoch holds whole steps, so an accumulation never straddles an epoch's end.
    """
    steps = steps_per_epoch(len(order), world_size, batch_size, passes)
    batches = np.array_split(order[rank::world_size], steps * passes)
    return [batches[step * passes : (step + 1) * passes] for step in range(steps)]


def eval_slice(num_samples: int, rank: int, world_size: int) -> np.ndarray:
    """This rank's contiguous slice of the test set: every image is counted exactly once."""
    return np.array_split(np.arange(num_samples), world_size)[rank]
