"""The framework-neutral training loop, shaped as pytorch/examples' DDP tutorial shapes it:
`run_step`, `run_epoch`, `save_snapshot` (and `load_snapshot`), `fit`.

It is handed its collaborators built: the run (adapter and model), the data, the metrics
writer, the snapshots; what happens at a step's or an epoch's end besides training is a hook's
(`hooks.py`). It talks to the framework only through the adapter. Rank 0 alone writes files and
shows progress; every rank runs the same steps and collectives, and stops at the same step.
"""

from __future__ import annotations

import math
import os
import platform
import signal
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import closing
from typing import Any

import numpy as np
from tqdm import tqdm

from hvd_train.adapters.base import Elastic, ElasticState, StepResult
from hvd_train.checkpoint import Checkpoint
from hvd_train.data import Splits
from hvd_train.data.pipeline import Step, Taken, augmentation, read_ahead, workers_for
from hvd_train.data.sharding import epoch_order, shard_steps
from hvd_train.errors import Stopped, UsageError
from hvd_train.hooks import Hook
from hvd_train.metrics import MetricsWriter, write_error
from hvd_train.options import RunOptions
from hvd_train.position import EpochPlan, Position
from hvd_train.run import Run
from hvd_train.schedule import LearningRateSchedule
from hvd_train.snapshots import Snapshots
from hvd_train.stopping import StopRequests
from hvd_train.throughput import Throughput
from hvd_train.version import __version__


def host_name() -> str:
    """This rank's host as horovodrun named it (-H, --hostfile), else the machine's name."""
    return os.environ.get("HOROVOD_HOSTNAME") or platform.node()


def step_seed(seed: int, global_step: int, rank: int) -> int:
    """The dropout seed of one step on one rank. Derived, not carried, so a resumed run draws
    exactly the numbers the uninterrupted run would have drawn."""
    return int(np.random.SeedSequence([seed, global_step, rank]).generate_state(1)[0])


class Trainer:
    def __init__(self, run: Run, data: Splits, options: RunOptions, snapshots: Snapshots,
                 metrics: MetricsWriter, hooks: list[Hook]) -> None:  # fmt: skip
        self.run, self.data, self.options, self.hooks = run, data, options, hooks
        self.adapter, self.recipe = run.adapter, run.recipe
        self.snapshots, self.metrics = snapshots, metrics
        assert options.output_dir is not None and options.seed is not None, "decided by now"
        self.output_dir, self.seed = options.output_dir, options.seed
        self.throughput = Throughput()
        self.elastic_state: ElasticState | None = None
        self.requests = StopRequests()
        self.workers = 0  # the data workers of the epoch that trains
        self.last_eval = dict.fromkeys(["loss", *self.recipe.metric_functions], float("nan"))
        self.resize()

    def resize(self) -> None:
        """What follows from the world size and this rank: steps per epoch (every rank takes a
        new shard), global batch, learning rate, and who writes the records. Called again when
        an elastic job resizes (rank 0 may then be another process)."""
        world_size, recipe = self.adapter.world_size, self.recipe
        self.metrics.enabled = self.adapter.is_rank_zero
        self.plan = EpochPlan.for_world(
            len(self.data.train), world_size, recipe.schedule, recipe.horovod,
            self.options.limit_steps,
        )  # fmt: skip
        self.schedule = LearningRateSchedule.from_recipe(
            recipe.schedule, self.adapter.learning_rate,
            world_size * recipe.horovod.backward_passes_per_step, self.plan.steps_per_epoch,
        )  # fmt: skip

    def examples(self, position: Position) -> int:
        """Training examples seen since the run began, whatever the world size: the position
        that metrics records carry."""
        size = len(self.data.train)
        return position.epoch * size + min(self.plan.samples(position), size)

    def run_step(self, batches: Iterator[Taken], indices: Step, step: int) -> StepResult:
        """One optimizer step on this rank's next batches (one per backward pass), whose
        examples are `indices`; the wait for them is the step's T_data."""
        adapter = self.adapter
        started = time.perf_counter()
        taken = next(batches)
        waited = time.perf_counter() - started
        if self.metrics.failure:
            self.requests.failure = self.metrics.failure
        result = adapter.train_step(
            taken, self.schedule(step), step_seed(self.seed, step, adapter.rank),
            self.requests.flags(),
        )  # fmt: skip
        images = sum(map(len, indices)) * adapter.world_size
        self.throughput.add(images, time.perf_counter() - started, result, waited)
        return result

    def run_epoch(self, epoch: int, first_step: int) -> float:
        """Trains epoch `epoch` from `first_step` on; the loss averaged over ranks and steps."""
        adapter, steps = self.adapter, self.plan.steps_per_epoch
        order = epoch_order(len(self.data.train), self.seed, epoch)
        shard = shard_steps(order, adapter.rank, adapter.world_size,
                            self.recipe.schedule.batch_size,
                            self.recipe.horovod.backward_passes_per_step)  # fmt: skip
        for hook in self.hooks:
            hook.before_epoch(self, epoch, first_step)
        loading = self.recipe.loading
        self.workers = workers_for(loading.workers, self.data.train, adapter.threads_per_rank())
        total = 0.0
        augment = augmentation(self.recipe.transforms(), self.seed, epoch)
        reading = read_ahead(self.data.train, shard[first_step:steps], self.workers,
                             loading.prefetch, augment, loading.timeout)  # fmt: skip
        with closing(reading) as batches:
            for index in range(first_step, steps):
                step = self.plan.global_step(Position(epoch, index))
                result = self.run_step(batches, shard[index], step)
                done = Position(epoch, index + 1)
                self.check_step(result, done)
                total += result.loss
                for hook in self.hooks:
                    hook.after_step(self, done, result)
        return total / max(1, steps - first_step)

    def check_step(self, result: StepResult, done: Position) -> None:
        """Stops every rank, at the same step, when the step's numbers are not finite or any
        rank asked to stop; the numbers are the same on every rank, so all decide alike."""
        if not (math.isfinite(result.loss) and math.isfinite(result.gradient_norm)):
            what = "loss" if not math.isfinite(result.loss) else "gradient norm"
            value = result.loss if what == "loss" else result.gradient_norm
            raise UsageError(
                f"the {what} became {value} at step {done.step} of epoch {done.epoch + 1}, and "
                "training stopped before saving anything after it; lower the learning rate "
                "(--lr) or clip the gradients (--set optimizer.gradient_clip_norm=1.0), and "
                "continue from the newest checkpoint with --resume",
                every_rank=True,
            )
        if result.flags.any():
            self.stop(done)

    def stop(self, done: Position) -> None:
        """Acts on a stop that some rank asked for: a failed write ends the job with its
        message; a signal, with a checkpoint at `done` and how to resume."""
        failures = [f for f in self.adapter.allgather_object(self.requests.failure) if f]
        if failures:
            raise UsageError(failures[0], every_rank=True)
        signum = next(s for s in self.adapter.allgather_object(self.requests.signal) if s)
        self.save_snapshot(done)
        message = (
            f"stopped by {signal.Signals(signum).name} at step {done.step} of epoch "
            f"{done.epoch + 1}, after saving a checkpoint; continue with: hvd-train --resume "
            f"--output-dir {self.output_dir}"
        )
        if self.adapter.is_rank_zero:
            tqdm.write(f"hvd-train: {message}")
        raise Stopped(signum, message)

    def save_snapshot(self, position: Position) -> None:
        self.snapshots.save(position, self.plan, self.schedule)

    def load_snapshot(self, checkpoint: Checkpoint) -> Position:
        """Rank 0 resumes from `checkpoint`; records after it are dropped, to be made anew."""
        position = self.snapshots.load(checkpoint, self.plan)
        self.metrics.keep_until(self.examples(position))
        return position

    def commit(self, position: Position) -> None:
        """Records `position` with the model in the elastic state: a failure rolls back to here."""
        assert self.elastic_state is not None
        self.elastic_state.epoch = position.epoch
        self.elastic_state.samples = self.plan.samples(position)
        self.elastic_state.commit()

    def fit(self, start: Position) -> dict[str, Any]:
        """Trains from `start` to the recipe's last epoch; the run's summary."""
        started = time.perf_counter()
        with self.requests.catching_signals():
            for epoch in range(start.epoch, self.recipe.schedule.epochs):
                train_loss = self.run_epoch(epoch, start.step if epoch == start.epoch else 0)
                for hook in self.hooks:
                    hook.after_epoch(self, epoch, train_loss)
        self.metrics.close()
        return self.summary(time.perf_counter() - started)

    def fit_elastic(self, begin: Callable[[], Position]) -> dict[str, Any]:
        """`fit` under Horovod's elastic driver. The job's first pass through the loop calls
        `begin` (on every rank together) for where to start; after a resize the job goes on
        from the last commit, with shards, step counts and learning rate recomputed for the new
        world size."""

        def loop(state: ElasticState) -> dict[str, Any]:
            self.elastic_state = state
            self.resize()
            if not state.started:
                start = begin()  # rank 0's model, optimizer and position, resumed or fresh...
                state.epoch, state.samples = start.epoch, self.plan.samples(start)
                state.started = True
                state.save()
                state.sync()  # ...on every rank
            position = self.plan.position_at(state.epoch, state.samples)
            # Rank 0 may be new, on another host: give it the run's folder, without the records
            # of steps after the commit that the job went back to.
            self.adapter.on_rank_zero(lambda: self.reopen_output(position))
            return self.fit(position)

        assert isinstance(self.adapter, Elastic), "checked when the run started"
        return self.adapter.run_elastic(loop)

    def reopen_output(self, position: Position) -> None:
        try:
            self.snapshots.directory.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise UsageError(write_error(self.snapshots.directory, error)) from None
        self.metrics.keep_until(self.examples(position))

    def summary(self, seconds: float) -> dict[str, Any]:
        adapter, recipe = self.adapter, self.recipe
        return {
            "recipe": recipe.name,
            "framework": adapter.name,
            "world_size": adapter.world_size,
            "epochs": recipe.schedule.epochs,
            "global_batch_size": self.plan.global_batch,
            "learning_rate": self.schedule.peak,
            **{f"test_{name}": value for name, value in self.last_eval.items()},
            "train_seconds": round(seconds, 2),
            **self.throughput.figures(),
            "hosts": dict(Counter(adapter.allgather_object(host_name()))),
            "hvd_train_version": __version__,
            "settings": recipe.settings_table(),  # the effective recipe
        }
