"""The loop's own work at its events, besides training: progress and records, mid-epoch and
end-of-epoch checkpoints, the replica check, elastic commits. Each is a `Callback` that reads
the loop through `Loop`; every rank calls the same ones in the same order, so their collectives
match. The loop imports them; they import nothing of the loop's."""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from typing import Any, Protocol

import numpy as np
from tqdm import tqdm

from hvd_train.callbacks import Callback, State
from hvd_train.distributed import Distributed, ElasticState
from hvd_train.recipe import Recipe
from hvd_train.recipe.learning_rate import LearningRateSchedule
from hvd_train.recipe.scoring import describe
from hvd_train.training.metrics import MetricsWriter
from hvd_train.training.options import RunOptions
from hvd_train.training.position import EpochPlan, Position
from hvd_train.training.progress import EpochProgress
from hvd_train.training.throughput import Throughput

DATA_WAIT_SHARE = 0.1  # of the steps' time, waiting for batches, that Reporting points out


class Loop(Protocol):
    """What the observers read of the loop that calls them (`trainer.Trainer`)."""

    dist: Distributed
    recipe: Recipe
    plan: EpochPlan
    schedule: LearningRateSchedule
    throughput: Throughput
    records: MetricsWriter
    position: Position  # the step just done; at an epoch's end, (next epoch, 0)
    elastic_state: ElasticState | None

    @property
    def workers(self) -> int: ...  # the data workers that read the training batches

    @property
    def evaluated_split(self) -> str: ...  # what evaluations in training measure: val or test

    def examples(self, position: Position) -> int: ...

    def where(self) -> str: ...  # the position in a message: "at step 3 of epoch 2", ...

    def save_snapshot(self, position: Position) -> None: ...

    def commit(self, position: Position) -> None: ...

    def save_if_best(self, position: Position, figure: float) -> None: ...


def of_split(metrics: Mapping[str, float], split: str) -> dict[str, float]:
    """The figures of one split's evaluation ("val" or "test"), by the metric's own name."""
    prefix = f"{split}_"
    return {k.removeprefix(prefix): v for k, v in metrics.items() if k.startswith(prefix)}


class Observer(Callback):
    def __init__(self, loop: Loop) -> None:
        self.loop = loop


class Reporting(Observer):
    """Rank 0's progress bar (or plain lines), its records and its line at each epoch's end:
    every `every` steps and at the epoch's end, the mean loss of the steps since the last
    record, and their speed; each evaluation's figures."""

    def __init__(self, loop: Loop, every: int) -> None:
        super().__init__(loop)
        self.every = every
        self.losses: list[float] = []
        self.bar = EpochProgress("", 0, 0, False)
        self.records = 0
        self.said_data_waits = False
        self.started = time.perf_counter()

    def on_epoch_start(self, state: State) -> None:
        loop = self.loop
        label = f"epoch {state.epoch + 1}/{loop.recipe.schedule.epochs}"
        steps = loop.plan.steps_per_epoch
        self.bar = EpochProgress(label, loop.position.step, steps, loop.dist.is_rank_zero)
        self.losses = []
        self.started = time.perf_counter()

    def on_step_end(self, state: State) -> None:
        done = self.loop.position
        self.losses.append(state.metrics["loss"])
        if len(self.losses) == self.every or done.step == self.loop.plan.steps_per_epoch:
            self.record(done)
        self.bar.step(done.step)

    def record(self, done: Position) -> None:
        loop = self.loop
        images, seconds = loop.throughput.since_last_record()
        step = loop.plan.global_step(done) - 1
        average = float(np.mean(self.losses))
        rates = [loop.schedule(s) for s in range(step + 1 - len(self.losses), step + 1)]
        speed = images / max(seconds, 1e-9)
        self.bar.show(loss=f"{average:.4f}", lr=f"{rates[-1]:.2e}", images_per_s=f"{speed:.0f}")
        loop.records.train(done.epoch + 1, step + 1, loop.examples(done), average, rates,
                           speed, 1000 * seconds / len(self.losses))  # fmt: skip
        self.losses = []
        self.records += 1
        self.say_if_data_waits()

    def say_if_data_waits(self) -> None:
        """Once, on rank 0, from the second record on (the first holds the workers' start):
        the steps waited for their batches for more than a tenth of their time."""
        share = self.loop.throughput.data_share()
        if self.said_data_waits or self.records < 2 or share <= DATA_WAIT_SHARE:
            return
        self.said_data_waits = True
        if self.loop.dist.is_rank_zero:
            tqdm.write(
                f"hvd-train: the steps waited for their batches {100 * share:.0f}% of the time "
                f"with {self.loop.workers} data workers; read further ahead with more "
                "(--set data.workers=N, [data] workers in the recipe) or from faster storage"
            )

    def on_evaluate(self, state: State, metrics: Mapping[str, float]) -> None:
        loop = self.loop
        loop.records.eval(state.epoch + 1, state.step, loop.examples(loop.position), metrics)

    def on_epoch_end(self, state: State) -> None:
        if self.losses:  # a stop part way through the epoch: the steps since the last record
            self.record(self.loop.position)
        self.bar.close()
        if self.loop.dist.is_rank_zero:
            split = self.loop.evaluated_split
            tqdm.write(
                f"epoch {state.epoch + 1}/{self.loop.recipe.schedule.epochs}: train loss "
                f"{state.metrics['loss']:.4f}, {describe(of_split(state.metrics, split), split)} "
                f"({time.perf_counter() - self.started:.1f} s)"
            )

    def on_train_end(self, state: State) -> None:
        if self.loop.evaluated_split == "val" and self.loop.dist.is_rank_zero:
            tqdm.write(f"at the end: {describe(of_split(state.metrics, 'test'))}")


class NewestCheckpoints(Observer):
    """A checkpoint at each epoch's end, and every `every` global steps within an epoch."""

    def __init__(self, loop: Loop, every: int | None) -> None:
        super().__init__(loop)
        self.every = every

    def on_step_end(self, state: State) -> None:
        done = self.loop.position
        within = done.step < self.loop.plan.steps_per_epoch  # the epoch's end saves anyway
        if self.every and state.step % self.every == 0 and within:
            self.loop.save_snapshot(done)

    def on_epoch_end(self, state: State) -> None:
        self.loop.save_snapshot(self.loop.position)


class ReplicaCheck(Observer):
    """The replica check (`Distributed.check_replicas`: every rank holds the same trained
    weights and optimizer state, bit for bit) at each evaluation, before anything of it is
    recorded or saved (the epoch's checkpoint, a best one), so a diverged epoch is never
    saved."""

    def on_evaluate(self, state: State, metrics: Mapping[str, float]) -> None:
        self.loop.dist.check_replicas(self.loop.where())


class ElasticCommits(Observer):
    """Under the elastic driver, a commit every `every` global steps and at each epoch's end:
    a failure rolls back to the last one."""

    def __init__(self, loop: Loop, every: int) -> None:
        super().__init__(loop)
        self.every = every

    def on_step_end(self, state: State) -> None:
        if self.loop.elastic_state and state.step % self.every == 0:
            self.loop.commit(self.loop.position)

    def on_epoch_end(self, state: State) -> None:
        if self.loop.elastic_state:
            self.loop.commit(self.loop.position)


class EarlyStopping(Observer):
    """Asks the loop to stop when the watched validation figure has not improved by more than
    `min_delta` over `patience` evaluations. The figures are the same on every rank, so every
    rank asks at the same evaluation."""

    def __init__(self, loop: Loop, monitor: str, patience: int, mode: str,
                 min_delta: float) -> None:  # fmt: skip
        super().__init__(loop)
        self.monitor, self.patience, self.min_delta = monitor, patience, min_delta
        self.sign = 1.0 if mode == "min" else -1.0  # the best is the lowest of sign * figure
        self.best, self.waited = math.inf, 0

    def state_dict(self) -> dict[str, Any]:
        return {"best": None if math.isinf(self.best) else self.best, "waited": self.waited}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        best = state["best"]
        self.best, self.waited = math.inf if best is None else best, state["waited"]

    def on_evaluate(self, state: State, metrics: Mapping[str, float]) -> None:
        if self.monitor not in metrics:  # the test set's evaluation at the end
            return
        value = self.sign * metrics[self.monitor]
        if value < self.best - self.min_delta:
            self.best, self.waited = value, 0
            return
        self.waited += 1
        if self.waited == self.patience:
            state.request_stop()
            if self.loop.dist.is_rank_zero:
                tqdm.write(
                    f"hvd-train: early stopping at step {state.step}: {self.monitor} has not "
                    f"improved on {self.sign * self.best:.4f} in {self.patience} evaluations"
                )


class BestCheckpoints(Observer):
    """Hands each evaluation's watched figure to the loop, which keeps the best checkpoints."""

    def __init__(self, loop: Loop, monitor: str) -> None:
        super().__init__(loop)
        self.monitor = monitor

    def on_evaluate(self, state: State, metrics: Mapping[str, float]) -> None:
        if self.monitor in metrics:
            self.loop.save_if_best(self.loop.position, metrics[self.monitor])


def loop_observers(loop: Loop, options: RunOptions) -> list[Callback]:
    """The loop's own observers, in the order it calls them: the replica check before anything
    is recorded or saved, the checkpoint before the elastic commit, the epoch's line, then
    early stopping, which may end training after it."""
    observers: list[Callback] = [ReplicaCheck(loop)]
    kept = loop.recipe.checkpoints
    if kept.keep_best:
        observers.append(BestCheckpoints(loop, kept.monitor))
    observers.append(NewestCheckpoints(loop, options.checkpoint_every))
    if options.elastic:
        observers.append(ElasticCommits(loop, options.commit_every))
    observers.append(Reporting(loop, options.log_every))
    stopping = loop.recipe.schedule.early_stopping
    if stopping is not None:
        observers.append(EarlyStopping(loop, **stopping))
    return observers
