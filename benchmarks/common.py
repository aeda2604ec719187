"""What every baseline shares with hvd_train, so that only the training machinery differs: the
model (hvd_train's own builders for the recipe's layers), the data (MNIST in memory, or
synthetic), the batch per process, and how throughput is measured."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from hvd_train.data import load_data, take
from hvd_train.recipe import Recipe, load_recipe

BATCH = 64  # per process


def setup(recipe_name: str) -> tuple[Recipe, object]:
    """The recipe and its training data (MNIST from $HVD_TRAIN_DATA_DIR, else the cache)."""
    recipe = load_recipe(recipe_name)
    data_dir = os.environ.get("HVD_TRAIN_DATA_DIR")
    return recipe, load_data(recipe, Path(data_dir) if data_dir else None).train


def batches(train, rank: int, world: int, count: int):
    """`count` batches of BATCH from this process's share of a shuffled order."""
    order = np.random.default_rng(0).permutation(len(train))[rank::world]
    for step in range(count):
        start = (step * BATCH) % (len(order) - BATCH)
        yield take(train, order[start : start + BATCH])


def measure(
    step: Callable[[np.ndarray, np.ndarray], None],
    train,
    rank: int,
    world: int,
    steps: int,
    warmup: int,
    synchronise: Callable[[], None] = lambda: None,
) -> float:
    """Images per second of `step` over `steps` steps after `warmup`, all processes together."""
    started = 0.0
    for index, (x, y) in enumerate(batches(train, rank, world, warmup + steps)):
        if index == warmup:
            synchronise()
            started = time.perf_counter()
        step(x, y)
    synchronise()
    return steps * BATCH * world / (time.perf_counter() - started)


def report(system: str, processes: int, threads: int, images_per_second: float) -> None:
    figures = {"system": system, "processes": processes, "threads": threads,
               "images_per_second": round(images_per_second, 1)}  # fmt: skip
    print("RESULT " + json.dumps(figures), flush=True)
