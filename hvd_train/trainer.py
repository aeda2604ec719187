"""The framework-neutral training loop: data shards, schedule, evaluation, checkpoints, metrics.

It talks to the framework only through an Adapter. Rank 0 alone writes files and shows
progress; every rank runs the same number of steps and collectives.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from hvd_train import __version__
from hvd_train.adapters import Adapter, create_adapter
from hvd_train.adapters.base import ElasticState
from hvd_train.checkpoint import (
    checkpoint_name,
    checkpoints,
    load_newest_valid,
    save_checkpoint,
)
from hvd_train.errors import UsageError
from hvd_train.evaluation import evaluate
from hvd_train.mnist import Mnist, load_mnist
from hvd_train.recipe import Recipe
from hvd_train.schedule import LearningRateSchedule
from hvd_train.sharding import epoch_order, shard_batches, steps_per_epoch


@dataclass(frozen=True)
class RunOptions:
    recipe: Recipe
    framework: str
    seed: int
    data_dir: Path | None
    output_dir: Path
    resume: bool
    log_every: int
    checkpoint_every: int | None = None  # steps between mid-epoch checkpoints
    keep_checkpoints: int = 3
    limit_steps: int | None = None  # cap on steps per epoch, for smoke runs
    elastic: bool = False
    commit_every: int = 10  # steps between commits of the elastic state


@dataclass(frozen=True)
class Position:
    """Where training stands: `step` steps into epoch `epoch` (both counted from 0)."""

    epoch: int
    step: int


def host_name() -> str:
    """This rank's host as horovodrun named it (-H, --hostfile), else the machine's name."""
    return os.environ.get("HOROVOD_HOSTNAME") or platform.node()


def step_seed(seed: int, global_step: int, rank: int) -> int:
    """The dropout seed of one step on one rank. Derived, not carried, so a resumed run draws
    exactly the numbers the uninterrupted run would have drawn."""
    return int(np.random.SeedSequence([seed, global_step, rank]).generate_state(1)[0])


def load_agreed_data(adapter: Adapter, options: RunOptions) -> Mnist:
    """Loads the data on every rank and checks that all ranks agree on what they run, so a
    mismatch (or a rank without data) stops the job with a message instead of a hang."""
    data, problem = None, None
    try:
        data = load_mnist(options.data_dir)
    except UsageError as error:
        problem = str(error)
    facts = {
        "hvd_train version": __version__,
        "framework": options.framework,
        "recipe": options.recipe.recipe_hash(),
        "seed": options.seed,
        "training images": None if data is None else len(data.train_labels),
        "test images": None if data is None else len(data.test_labels),
    }
    everyone = adapter.allgather_object((problem, facts))
    for rank, (rank_problem, _) in enumerate(everyone):
        if rank_problem is not None:
            raise UsageError(
                f"rank {rank}: {rank_problem}" if adapter.world_size > 1 else rank_problem
            )
    reference = everyone[0][1]
    for rank, (_, rank_facts) in enumerate(everyone):
        for key, value in rank_facts.items():
            if value != reference[key]:
                raise UsageError(
                    f"rank {rank} disagrees with rank 0 on the {key} ({value!r} vs "
                    f"{reference[key]!r}); run the same hvd_train, recipe, flags and data on "
                    "every host"
                )
    assert data is not None
    return data


def prepare_output_dir(output_dir: Path, resume: bool) -> None:
    """Creates the run directory; refuses to write over an earlier run's checkpoints."""
    try:
        (output_dir / "checkpoints").mkdir(parents=True, exist_ok=True)
        probe = output_dir / f".write-test-{time.time_ns()}"
        probe.touch()
        probe.unlink()
    except OSError as error:
        raise UsageError(
            f"cannot write to output directory {output_dir} ({error.strerror}); "
            "choose another --output-dir"
        ) from None
    if not resume and checkpoints(output_dir / "checkpoints"):
        raise UsageError(
            f"{output_dir} already holds checkpoints; pass --resume to continue that run "
            "or choose another --output-dir"
        )


class Trainer:
    def __init__(self, adapter: Adapter, data: Mnist, options: RunOptions) -> None:
        self.adapter, self.data, self.options = adapter, data, options
        self.recipe = options.recipe
        self.checkpoint_dir = options.output_dir / "checkpoints"
        self.metrics_path = options.output_dir / "metrics.jsonl"
        self.images_trained = 0
        self.step_seconds = 0.0
        self.elastic_state: ElasticState | None = None
        self.configure()

    def configure(self) -> None:
        """What follows from the world size: the global batch, the steps per epoch (every rank
        takes a new shard) and the learning rate. Called again when an elastic job resizes."""
        world_size, batch_size = self.adapter.world_size, self.recipe.schedule.batch_size
        self.global_batch = batch_size * world_size
        self.steps = min(
            steps_per_epoch(len(self.data.train_labels), world_size, batch_size),
            self.options.limit_steps or sys.maxsize,
        )
        self.schedule = LearningRateSchedule.from_recipe(
            self.recipe.schedule, self.recipe.optimizer.learning_rate, world_size, self.steps
        )

    def restore(self) -> Position:
        """Loads the newest valid checkpoint into rank 0's model and optimizer."""
        checkpoint = load_newest_valid(self.checkpoint_dir)
        if checkpoint is None:
            raise UsageError(
                f"nothing to resume: {self.checkpoint_dir} holds no valid checkpoint; "
                "leave out --resume to start a new run"
            )
        state, path = checkpoint.state, checkpoint.path
        if state["architecture"] != self.recipe.architecture_hash():
            raise UsageError(
                f"checkpoint {path} was written for another model (recipe {state['recipe']!r}); "
                "resume with that recipe or choose another --output-dir"
            )
        if state["framework"] != self.adapter.name:
            raise UsageError(
                f"checkpoint {path} was written by {state['framework']}; "
                f"resume it with --framework {state['framework']}"
            )
        position = self.position_at(state["epoch"], state["samples_in_epoch"])
        if position.epoch >= self.recipe.schedule.epochs:
            raise UsageError(
                f"the run in {self.options.output_dir} already finished {position.epoch} "
                "epochs; raise --epochs to train further"
            )
        self.adapter.load_weights(checkpoint.weights)
        self.adapter.load_optimizer_state(checkpoint.optimizer)
        print(f"hvd-train: resuming from {path}", flush=True)
        return position

    def log(self, record: dict[str, Any]) -> None:
        if self.adapter.is_rank_zero:
            with self.metrics_path.open("a") as out:
                out.write(json.dumps(record) + "\n")

    def save(self, position: Position) -> None:
        if not self.adapter.is_rank_zero:
            return
        state = {
            "epoch": position.epoch,
            "step_in_epoch": position.step,
            "samples_in_epoch": self.samples(position),
            "global_step": self.global_step(position),
            "seed": self.options.seed,
            "world_size": self.adapter.world_size,
            "global_batch_size": self.global_batch,
            "learning_rate": {
                "base": self.schedule.base,
                "peak": self.schedule.peak,
                "scaling": self.recipe.schedule.lr_scaling,
            },
            "recipe": self.recipe.name,
            "recipe_hash": self.recipe.recipe_hash(),
            "architecture": self.recipe.architecture_hash(),
            "framework": self.adapter.name,
            "hvd_train_version": __version__,
        }
        save_checkpoint(
            self.checkpoint_dir,
            checkpoint_name(position.epoch, self.samples(position)),
            self.adapter.weights(),
            self.adapter.optimizer_state(),
            state,
            self.recipe.text,
            self.options.keep_checkpoints,
        )

    def commit(self, position: Position) -> None:
        """Records `position` with the model in the elastic state: a failure rolls back to here."""
        assert self.elastic_state is not None
        self.elastic_state.epoch = position.epoch
        self.elastic_state.samples = self.samples(position)
        self.elastic_state.commit()

    def fit_elastic(self, start: Position) -> dict[str, Any]:
        """`fit` under Horovod's elastic driver; after a resize it goes on from the last commit
        with shards, step counts and learning rate recomputed for the new world size."""

        def loop(state: ElasticState) -> dict[str, Any]:
            self.elastic_state = state
            self.configure()
            return self.fit(self.position_at(state.epoch, state.samples))

        return self.adapter.run_elastic(loop, start.epoch, self.samples(start))

    def samples(self, position: Position) -> int:
        """Training samples consumed, across all ranks, in the epoch of `position`."""
        return position.step * self.global_batch

    def position_at(self, epoch: int, samples: int) -> Position:
        """Where `samples` into `epoch` falls with this world size (it may have changed)."""
        return Position(epoch, min(samples // self.global_batch, self.steps))

    def global_step(self, position: Position) -> int:
        return position.epoch * self.steps + position.step

    def run_epoch(self, epoch: int, first_step: int) -> float:
        """Trains epoch `epoch` from `first_step` on; the loss averaged over ranks and steps."""
        adapter, data, seed = self.adapter, self.data, self.options.seed
        order = epoch_order(len(data.train_labels), seed, epoch)
        batches = shard_batches(
            order, adapter.rank, adapter.world_size, self.recipe.schedule.batch_size
        )
        bar = tqdm(
            range(first_step, self.steps),
            desc=f"epoch {epoch + 1}/{self.recipe.schedule.epochs}",
            unit="step",
            disable=not adapter.is_rank_zero,
            leave=False,
            mininterval=0.5,
        )
        window: list[float] = []
        total = 0.0
        for index in bar:
            batch, step = batches[index], self.global_step(Position(epoch, index))
            learning_rate = self.schedule(step)
            started = time.perf_counter()
            loss = adapter.train_step(
                data.train_images[batch],
                data.train_labels[batch],
                learning_rate,
                step_seed(seed, step, adapter.rank),
            )
            self.step_seconds += time.perf_counter() - started
            self.images_trained += len(batch) * adapter.world_size
            window.append(loss)
            done = Position(epoch, index + 1)
            if len(window) == self.options.log_every or done.step == self.steps:
                average = float(adapter.allreduce_mean(np.array([np.mean(window)]))[0])
                total += average * len(window)
                window = []
                bar.set_postfix(loss=f"{average:.4f}", lr=f"{learning_rate:.2e}")
                self.log(
                    {
                        "kind": "train",
                        "epoch": epoch + 1,
                        "step": step + 1,
                        "loss": average,
                        "learning_rate": learning_rate,
                    }
                )
            every = self.options.checkpoint_every
            if every and (step + 1) % every == 0 and done.step < self.steps:
                self.save(done)
            if self.elastic_state and (step + 1) % self.options.commit_every == 0:
                self.commit(done)
        return total / max(1, self.steps - first_step)

    def fit(self, start: Position) -> dict[str, Any]:
        adapter, recipe = self.adapter, self.recipe
        test_loss = accuracy = float("nan")
        started = time.perf_counter()
        for epoch in range(start.epoch, recipe.schedule.epochs):
            epoch_started = time.perf_counter()
            train_loss = self.run_epoch(epoch, start.step if epoch == start.epoch else 0)
            test_loss, accuracy = evaluate(adapter, self.data)
            end = Position(epoch + 1, 0)
            self.log(
                {
                    "kind": "eval",
                    "epoch": epoch + 1,
                    "step": self.global_step(end),
                    "test_loss": test_loss,
                    "test_accuracy": accuracy,
                }
            )
            self.save(end)
            if self.elastic_state:
                self.commit(end)
            if adapter.is_rank_zero:
                tqdm.write(
                    f"epoch {epoch + 1}/{recipe.schedule.epochs}: train loss {train_loss:.4f}, "
                    f"test loss {test_loss:.4f}, test accuracy {accuracy:.2%} "
                    f"({time.perf_counter() - epoch_started:.1f} s)"
                )
        return {
            "recipe": recipe.name,
            "framework": adapter.name,
            "world_size": adapter.world_size,
            "epochs": recipe.schedule.epochs,
            "global_batch_size": self.global_batch,
            "learning_rate": self.schedule.peak,
            "test_accuracy": accuracy,
            "test_loss": test_loss,
            "train_seconds": round(time.perf_counter() - started, 2),
            "images_per_second": round(self.images_trained / self.step_seconds, 1),
            "hosts": dict(Counter(adapter.allgather_object(host_name()))),
            "hvd_train_version": __version__,
        }


def train(options: RunOptions) -> dict[str, Any]:
    """Runs one training job on this rank; the summary (written by rank 0)."""
    adapter = create_adapter(options.framework)
    if options.elastic and not adapter.supports_elastic:
        raise UsageError(
            f"--elastic is not available with --framework {options.framework}: Horovod's elastic "
            "state for TensorFlow targets Keras 2; use --framework torch, or drop --elastic and "
            "rely on --resume"
        )
    adapter.init()
    data = load_agreed_data(adapter, options)
    adapter.on_rank_zero(lambda: prepare_output_dir(options.output_dir, options.resume))
    adapter.build(options.recipe, options.seed)
    trainer = Trainer(adapter, data, options)
    start = adapter.on_rank_zero(trainer.restore) if options.resume else Position(0, 0)
    if options.elastic:  # the elastic state broadcasts rank 0's model and position itself
        summary = trainer.fit_elastic(start)
    else:
        adapter.broadcast_state(include_optimizer=options.resume)
        summary = trainer.fit(start)
    if adapter.is_rank_zero:
        (options.output_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary
