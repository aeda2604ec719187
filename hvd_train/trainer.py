"""The framework-neutral training loop, shaped as pytorch/examples' DDP tutorial shapes it:
`run_batch`, `run_epoch`, `save_snapshot` (and `load_snapshot`), `fit`.

It talks to the framework only through an Adapter and to the data only through `Dataset`s.
Rank 0 alone writes files and shows progress; every rank runs the same number of steps and
collectives.
"""

from __future__ import annotations

import os
import platform
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from hvd_train import __version__
from hvd_train.adapters import Adapter
from hvd_train.adapters.base import ElasticState
from hvd_train.checkpoint import (
    check_layout,
    check_weights_fit,
    checkpoint_name,
    load_newest_valid,
    save_checkpoint,
)
from hvd_train.data import Splits, take
from hvd_train.data.sharding import epoch_order, shard_batches
from hvd_train.errors import UsageError
from hvd_train.evaluation import evaluate
from hvd_train.metrics import MetricsWriter
from hvd_train.progress import Position, Progress
from hvd_train.recipe import Recipe
from hvd_train.recipe.toml import recipe_toml
from hvd_train.schedule import LearningRateSchedule


@dataclass(frozen=True)
class RunOptions:
    """How to run a recipe (not what it trains): the CLI's flags, the API's keywords."""

    framework: str
    output_dir: Path
    seed: int = 42
    data_dir: Path | None = None
    resume: bool = False
    log_every: int = 50
    checkpoint_every: int | None = None  # steps between mid-epoch checkpoints
    keep_checkpoints: int = 3
    limit_steps: int | None = None  # cap on steps per epoch, for smoke runs
    elastic: bool = False
    commit_every: int = 10  # steps between commits of the elastic state


def host_name() -> str:
    """This rank's host as horovodrun named it (-H, --hostfile), else the machine's name."""
    return os.environ.get("HOROVOD_HOSTNAME") or platform.node()


def step_seed(seed: int, global_step: int, rank: int) -> int:
    """The dropout seed of one step on one rank. Derived, not carried, so a resumed run draws
    exactly the numbers the uninterrupted run would have drawn."""
    return int(np.random.SeedSequence([seed, global_step, rank]).generate_state(1)[0])


class Trainer:
    def __init__(self, adapter: Adapter, data: Splits, recipe: Recipe, options: RunOptions) -> None:
        self.adapter, self.data, self.recipe, self.options = adapter, data, recipe, options
        self.metrics = MetricsWriter(options.output_dir, adapter.is_rank_zero)
        self.checkpoint_dir = options.output_dir / "checkpoints"
        self.images_trained, self.step_seconds = 0, 0.0
        self.elastic_state: ElasticState | None = None
        self.resize()

    def resize(self) -> None:
        """What follows from the world size: steps per epoch (every rank takes a new shard),
        global batch and learning rate. Called again when an elastic job resizes."""
        world_size, recipe = self.adapter.world_size, self.recipe
        self.progress = Progress.for_world(
            len(self.data.train), world_size, recipe.schedule.batch_size, self.options.limit_steps
        )
        self.schedule = LearningRateSchedule.from_recipe(
            recipe.schedule, recipe.optimizer.learning_rate, world_size,
            self.progress.steps_per_epoch,
        )  # fmt: skip

    def run_batch(self, indices: np.ndarray, step: int) -> float:
        """One training step on this rank's batch; the local loss."""
        adapter = self.adapter
        x, y = take(self.data.train, indices)
        started = time.perf_counter()
        loss = adapter.train_step(
            x, y, self.schedule(step), step_seed(self.options.seed, step, adapter.rank)
        )
        self.step_seconds += time.perf_counter() - started
        self.images_trained += len(indices) * adapter.world_size
        return loss

    def run_epoch(self, epoch: int, first_step: int) -> float:
        """Trains epoch `epoch` from `first_step` on; the loss averaged over ranks and steps."""
        adapter, steps = self.adapter, self.progress.steps_per_epoch
        order = epoch_order(len(self.data.train), self.options.seed, epoch)
        batches = shard_batches(
            order, adapter.rank, adapter.world_size, self.recipe.schedule.batch_size
        )
        bar = tqdm(
            range(first_step, steps),
            desc=f"epoch {epoch + 1}/{self.recipe.schedule.epochs}",
            unit="step",
            disable=not adapter.is_rank_zero,
            leave=False,
            mininterval=0.5,
        )
        window: list[float] = []
        total = 0.0
        for index in bar:
            step = self.progress.global_step(Position(epoch, index))
            window.append(self.run_batch(batches[index], step))
            done = Position(epoch, index + 1)
            if len(window) == self.options.log_every or done.step == steps:
                average = float(adapter.allreduce_mean(np.array([np.mean(window)]))[0])
                total += average * len(window)
                window = []
                bar.set_postfix(loss=f"{average:.4f}", lr=f"{self.schedule(step):.2e}")
                self.metrics.train(epoch + 1, step + 1, average, self.schedule(step))
            self.after_step(done)
        return total / max(1, steps - first_step)

    def after_step(self, done: Position) -> None:
        """Mid-epoch checkpoints and elastic commits, every so many global steps."""
        step = self.progress.global_step(done)
        every = self.options.checkpoint_every
        if every and step % every == 0 and done.step < self.progress.steps_per_epoch:
            self.save_snapshot(done)
        if self.elastic_state and step % self.options.commit_every == 0:
            self.commit(done)

    def save_snapshot(self, position: Position) -> None:
        """Rank 0 writes a checkpoint of `position`: model, optimizer and where it stands."""
        if not self.adapter.is_rank_zero:
            return
        adapter, recipe, samples = self.adapter, self.recipe, self.progress.samples(position)
        state = {
            "epoch": position.epoch,
            "step_in_epoch": position.step,
            "samples_in_epoch": samples,
            "global_step": self.progress.global_step(position),
            "seed": self.options.seed,
            "world_size": adapter.world_size,
            "global_batch_size": self.progress.global_batch,
            "learning_rate": {
                "base": self.schedule.base,
                "peak": self.schedule.peak,
                "scaling": recipe.schedule.lr_scaling,
            },
            "recipe": recipe.name,
            "recipe_source": recipe.source,
            "recipe_hash": recipe.recipe_hash(),
            "layout": recipe.layout(adapter.name),
            "framework": adapter.name,
            "hvd_train_version": __version__,
        }
        save_checkpoint(self.checkpoint_dir, checkpoint_name(position.epoch, samples),
                        adapter.weights(), adapter.optimizer_state(), state, recipe_toml(recipe),
                        self.options.keep_checkpoints)  # fmt: skip

    def load_snapshot(self) -> Position:
        """Loads the newest valid checkpoint into rank 0's model and optimizer."""
        checkpoint = load_newest_valid(self.checkpoint_dir)
        if checkpoint is None:
            raise UsageError(
                f"nothing to resume: {self.checkpoint_dir} holds no valid checkpoint; "
                "leave out --resume to start a new run"
            )
        state, adapter = checkpoint.state, self.adapter
        check_layout(checkpoint, adapter.name, self.recipe.layout(adapter.name))
        remedy = "resume with that recipe or choose another --output-dir"
        check_weights_fit(checkpoint, adapter.weights(), remedy)
        if state["framework"] != adapter.name:  # the optimizer's state is the framework's own
            raise UsageError(
                f"checkpoint {checkpoint.path} was written by {state['framework']}; "
                f"resume it with --framework {state['framework']}"
            )
        position = self.progress.position_at(state["epoch"], state["samples_in_epoch"])
        if position.epoch >= self.recipe.schedule.epochs:
            raise UsageError(
                f"the run in {self.options.output_dir} already finished {position.epoch} "
                "epochs; raise --epochs to train further"
            )
        adapter.load_weights(checkpoint.weights)
        adapter.load_optimizer_state(checkpoint.optimizer)
        print(f"hvd-train: resuming from {checkpoint.path}", flush=True)
        return position

    def commit(self, position: Position) -> None:
        """Records `position` with the model in the elastic state: a failure rolls back to here."""
        assert self.elastic_state is not None
        self.elastic_state.epoch = position.epoch
        self.elastic_state.samples = self.progress.samples(position)
        self.elastic_state.commit()

    def end_epoch(self, epoch: int, train_loss: float, started: float) -> float:
        """Evaluates, logs and checkpoints the end of epoch `epoch`; the test accuracy."""
        test_loss, accuracy = evaluate(self.adapter, self.data.test)
        end = Position(epoch + 1, 0)
        self.metrics.eval(epoch + 1, self.progress.global_step(end), test_loss, accuracy)
        self.save_snapshot(end)
        if self.elastic_state:
            self.commit(end)
        if self.adapter.is_rank_zero:
            tqdm.write(
                f"epoch {epoch + 1}/{self.recipe.schedule.epochs}: train loss {train_loss:.4f}, "
                f"test loss {test_loss:.4f}, test accuracy {accuracy:.2%} "
                f"({time.perf_counter() - started:.1f} s)"
            )
        self.last_eval = (test_loss, accuracy)
        return accuracy

    def fit(self, start: Position) -> dict[str, Any]:
        """Trains from `start` to the recipe's last epoch; the run's summary."""
        self.last_eval = (float("nan"), float("nan"))
        started = time.perf_counter()
        for epoch in range(start.epoch, self.recipe.schedule.epochs):
            epoch_started = time.perf_counter()
            train_loss = self.run_epoch(epoch, start.step if epoch == start.epoch else 0)
            self.end_epoch(epoch, train_loss, epoch_started)
        return self.summary(time.perf_counter() - started)

    def fit_elastic(self, start: Position) -> dict[str, Any]:
        """`fit` under Horovod's elastic driver; after a resize it goes on from the last commit
        with shards, step counts and learning rate recomputed for the new world size."""

        def loop(state: ElasticState) -> dict[str, Any]:
            self.elastic_state = state
            self.resize()
            return self.fit(self.progress.position_at(state.epoch, state.samples))

        return self.adapter.run_elastic(loop, start.epoch, self.progress.samples(start))

    def summary(self, seconds: float) -> dict[str, Any]:
        adapter, recipe = self.adapter, self.recipe
        summary = {
            "recipe": recipe.name,
            "framework": adapter.name,
            "world_size": adapter.world_size,
            "epochs": recipe.schedule.epochs,
            "global_batch_size": self.progress.global_batch,
            "learning_rate": self.schedule.peak,
            "test_accuracy": self.last_eval[1],
            "test_loss": self.last_eval[0],
            "train_seconds": round(seconds, 2),
            "images_per_second": round(self.images_trained / max(self.step_seconds, 1e-9), 1),
            "hosts": dict(Counter(adapter.allgather_object(host_name()))),
            "hvd_train_version": __version__,
        }
        self.metrics.summary(summary)
        return summary
