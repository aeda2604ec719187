"""What every baseline shares with hvd_train, so that only the training machinery differs: the
model (the recipe's torch module, or hvd_train's own builders for its layers), the data (MNIST
in memory, or synthetic), the recipe's batch per process, and how throughput is measured."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from hvd_train.data import take
from hvd_train.recipe import Recipe, load_data, load_recipe
from hvd_train.training.run import open_run


def setup(recipe_name: str) -> tuple[Recipe, object]:
    """The recipe and its training data (MNIST from $HVD_TRAIN_DATA_DIR, else the cache)."""
    recipe = load_recipe(recipe_name)
    data_dir = os.environ.get("HVD_TRAIN_DATA_DIR")
    return recipe, load_data(recipe, Path(data_dir) if data_dir else None).train


def batches(train, batch: int, rank: int, world: int, count: int):
    """`count` batches of `batch` from this process's share of a shuffled order."""
    order = np.random.default_rng(0).permutation(len(train))[rank::world]
    for step in range(count):
        start = (step * batch) % (len(order) - batch)
        yield take(train, order[start : start + batch])


def measure(
    step: Callable[[np.ndarray, np.ndarray], None],
    train,
    batch: int,
    rank: int,
    world: int,
    steps: int,
    warmup: int,
    synchronise: Callable[[], None] = lambda: None,
) -> float:
    """Images per second of `step` over `steps` steps after `warmup`, all processes together."""
    started = 0.0
    for index, (x, y) in enumerate(batches(train, batch, rank, world, warmup + steps)):
        if index == warmup:
            synchronise()
            started = time.perf_counter()
        step(x, y)
    synchronise()
    return steps * batch * world / (time.perf_counter() - started)


def alternate(
    framework: str,
    recipe: Recipe,
    plain_step: Callable[[np.ndarray, np.ndarray], None],
    train,
    steps: int,
    warmup: int,
) -> tuple[float, float]:
    """Images per second of hvd_train's own training step and of `plain_step`, taking turns
    on the same batches in this one process on the same threads: a slow spell of this shared
    machine falls on both alike, so their ratio is hvd_train's own overhead (separate runs
    moved it by 10-20%)."""
    # A world of one: the layer sends nothing through Horovod.
    dist = open_run(framework, recipe, seed=0).dist
    flags, seconds = np.zeros(2), np.zeros(2)
    batch = recipe.schedule.batch_size
    for index, (x, y) in enumerate(batches(train, batch, 0, 1, warmup + steps)):
        started = time.perf_counter()
        dist.exchange.step([(x, y)], 1e-3, index, flags)
        middle = time.perf_counter()
        plain_step(x, y)
        if index >= warmup:
            seconds += (middle - started, time.perf_counter() - middle)
    hvd_train, plain = steps * batch / seconds
    return hvd_train, plain


def report(system: str, processes: int, threads: int, images_per_second: float,
           **more: float) -> None:  # fmt: skip
    figures = {"system": system, "processes": processes, "threads": threads,
               "images_per_second": round(images_per_second, 1)}  # fmt: skip
    print("RESULT " + json.dumps(figures | {k: round(v, 1) for k, v in more.items()}), flush=True)
