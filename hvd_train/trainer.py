"""The framework-neutral training loop, shaped as pytorch/examples' DDP tutorial shapes it:
`run_step`, `run_epoch`, `save_snapshot` (and `load_snapshot`), `fit`.

It talks to the framework only through an Adapter and to the data only through `Dataset`s.
Rank 0 alone writes files and shows progress; every rank runs the same number of steps and
collectives.
"""

from __future__ import annotations

import hashlib
import math
import os
import platform
import signal
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import numpy as np
from tqdm import tqdm

from hvd_train import __version__
from hvd_train.adapters.base import Elastic, ElasticState, StepResult
from hvd_train.checkpoint import Checkpoint, checkpoint_name, save_checkpoint
from hvd_train.data import Splits, take
from hvd_train.data.sharding import epoch_order, shard_steps
from hvd_train.errors import ReplicasDiverged, Stopped, UsageError
from hvd_train.evaluation import evaluate
from hvd_train.metrics import MetricsWriter, write_error
from hvd_train.options import RunOptions
from hvd_train.plot import plot_runs
from hvd_train.progress import Position, Progress
from hvd_train.recipe.toml import recipe_toml
from hvd_train.report import EpochProgress
from hvd_train.run import Run
from hvd_train.schedule import LearningRateSchedule
from hvd_train.stopping import StopRequests

IMAGES_PER_SECOND_BASIS = (
    "the images of every training step on all ranks, over the wall time of all those steps on "
    "rank 0 (taking the batches, forward, backward, exchange, update); evaluation, checkpoints "
    "and start-up are outside it"
)


def host_name() -> str:
    """This rank's host as horovodrun named it (-H, --hostfile), else the machine's name."""
    return os.environ.get("HOROVOD_HOSTNAME") or platform.node()


def step_seed(seed: int, global_step: int, rank: int) -> int:
    """The dropout seed of one step on one rank. Derived, not carried, so a resumed run draws
    exactly the numbers the uninterrupted run would have drawn."""
    return int(np.random.SeedSequence([seed, global_step, rank]).generate_state(1)[0])


class Trainer:
    def __init__(self, run: Run, data: Splits, options: RunOptions) -> None:
        self.run, self.data, self.options = run, data, options
        self.adapter, self.recipe = run.adapter, run.recipe
        assert options.output_dir is not None and options.seed is not None, "decided by now"
        self.output_dir, self.seed = options.output_dir, options.seed
        self.metrics = MetricsWriter(self.output_dir, len(data.train))
        self.checkpoint_dir = self.output_dir / "checkpoints"
        self.images_trained, self.step_seconds = 0, 0.0
        self.steps_trained, self.step_parts = 0, np.zeros(2)  # T_comp and T_sync, summed
        self.logged = (0, 0.0)  # images and seconds at the last record
        self.elastic_state: ElasticState | None = None
        self.requests = StopRequests()
        self.resize()

    def resize(self) -> None:
        """What follows from the world size and this rank: steps per epoch (every rank takes a
        new shard), global batch, learning rate, and who writes the records. Called again when
        an elastic job resizes (rank 0 may then be another process)."""
        world_size, recipe = self.adapter.world_size, self.recipe
        self.metrics.enabled = self.adapter.is_rank_zero
        self.progress = Progress.for_world(
            len(self.data.train), world_size, recipe.schedule, recipe.horovod,
            self.options.limit_steps,
        )  # fmt: skip
        self.schedule = LearningRateSchedule.from_recipe(
            recipe.schedule, recipe.optimizer.learning_rate,
            world_size * recipe.horovod.backward_passes_per_step, self.progress.steps_per_epoch,
        )  # fmt: skip

    def examples(self, position: Position) -> int:
        """Training examples seen since the run began, whatever the world size: the position
        that metrics records carry."""
        size = len(self.data.train)
        return position.epoch * size + min(self.progress.samples(position), size)

    def run_step(self, batches: list[np.ndarray], step: int) -> StepResult:
        """One optimizer step on this rank's batches (one per backward pass)."""
        adapter = self.adapter
        started = time.perf_counter()
        taken = [take(self.data.train, indices) for indices in batches]
        if self.metrics.failure:
            self.requests.failure = self.metrics.failure
        result = adapter.train_step(
            taken, self.schedule(step), step_seed(self.seed, step, adapter.rank),
            self.requests.flags(),
        )  # fmt: skip
        self.step_seconds += time.perf_counter() - started
        self.images_trained += sum(map(len, batches)) * adapter.world_size
        self.steps_trained += 1
        self.step_parts += (result.compute_seconds, result.sync_seconds)
        return result

    def run_epoch(self, epoch: int, first_step: int) -> float:
        """Trains epoch `epoch` from `first_step` on; the loss averaged over ranks and steps."""
        adapter, steps = self.adapter, self.progress.steps_per_epoch
        order = epoch_order(len(self.data.train), self.seed, epoch)
        shard = shard_steps(order, adapter.rank, adapter.world_size,
                            self.recipe.schedule.batch_size,
                            self.recipe.horovod.backward_passes_per_step)  # fmt: skip
        label = f"epoch {epoch + 1}/{self.recipe.schedule.epochs}"
        report = EpochProgress(label, first_step, steps, adapter.is_rank_zero)
        window: list[float] = []
        total = 0.0
        for index in range(first_step, steps):
            step = self.progress.global_step(Position(epoch, index))
            result = self.run_step(shard[index], step)
            done = Position(epoch, index + 1)
            self.check_step(result, done)
            window.append(result.loss)
            if len(window) == self.options.log_every or done.step == steps:
                total += sum(window)
                self.log_window(window, done, step, report)
                window = []
            report.step(done.step)
            self.after_step(done)
        report.close()
        return total / max(1, steps - first_step)

    def log_window(
        self, losses: list[float], done: Position, step: int, report: EpochProgress
    ) -> None:
        """Records the steps since the last record: their mean loss, and the speed."""
        images, seconds = self.images_trained - self.logged[0], self.step_seconds - self.logged[1]
        self.logged = (self.images_trained, self.step_seconds)
        average, rate = float(np.mean(losses)), self.schedule(step)
        speed = images / max(seconds, 1e-9)
        report.show(loss=f"{average:.4f}", lr=f"{rate:.2e}", images_per_s=f"{speed:.0f}")
        self.metrics.train(done.epoch + 1, step + 1, self.examples(done), average, rate,
                           speed, 1000 * seconds / len(losses))  # fmt: skip

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
                "continue from the newest checkpoint with --resume"
            )
        if result.flags.any():
            self.stop(done)

    def stop(self, done: Position) -> None:
        """Acts on a stop that some rank asked for: a failed write ends the job with its
        message; a signal, with a checkpoint at `done` and how to resume."""
        failures = [f for f in self.adapter.allgather_object(self.requests.failure) if f]
        if failures:
            raise UsageError(failures[0])
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

    def after_step(self, done: Position) -> None:
        """Mid-epoch checkpoints and elastic commits, every so many global steps."""
        step = self.progress.global_step(done)
        every = self.options.checkpoint_every
        if every and step % every == 0 and done.step < self.progress.steps_per_epoch:
            self.save_snapshot(done)
        if self.elastic_state and step % self.options.commit_every == 0:
            self.commit(done)

    def save_snapshot(self, position: Position) -> None:
        """Rank 0 writes a checkpoint of `position`: model, optimizer and where it stands. A
        failed write stops every rank with its message."""
        self.adapter.on_rank_zero(lambda: self._write_snapshot(position))

    def _write_snapshot(self, position: Position) -> None:
        adapter, recipe, samples = self.adapter, self.recipe, self.progress.samples(position)
        state = {
            "epoch": position.epoch,
            "step_in_epoch": position.step,
            "samples_in_epoch": samples,
            "global_step": self.progress.global_step(position),
            "seed": self.seed,
            "limit_steps": self.options.limit_steps,
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
            "layout": self.run.layout.name,
            "framework": adapter.name,
            "hvd_train_version": __version__,
        }
        save_checkpoint(self.checkpoint_dir, checkpoint_name(position.epoch, samples),
                        self.run.weights(), adapter.optimizer_state(), state, recipe_toml(recipe),
                        self.options.keep_checkpoints)  # fmt: skip

    def load_snapshot(self, checkpoint: Checkpoint) -> Position:
        """Loads `checkpoint` into rank 0's model and optimizer; where it stands."""
        state, adapter = checkpoint.state, self.adapter
        self.run.load_weights(checkpoint, "resume with that recipe or choose another --output-dir")
        if state["framework"] != adapter.name:  # the optimizer's state is the framework's own
            raise UsageError(
                f"checkpoint {checkpoint.path} was written by {state['framework']}; "
                f"resume it with --framework {state['framework']}"
            )
        position = self.progress.position_at(state["epoch"], state["samples_in_epoch"])
        if position.epoch >= self.recipe.schedule.epochs:
            raise UsageError(
                f"the run in {self.output_dir} already finished {position.epoch} "
                "epochs; raise --epochs to train further"
            )
        try:
            adapter.load_optimizer_state(checkpoint.optimizer)
        except (ValueError, KeyError, RuntimeError) as error:
            raise UsageError(
                f"checkpoint {checkpoint.path}'s optimizer state does not fit this optimizer "
                f"({error}); resume with the recipe that wrote it"
            ) from None
        self.metrics.keep_until(self.examples(position))
        print(f"hvd-train: resuming from {checkpoint.path}", flush=True)
        return position

    def commit(self, position: Position) -> None:
        """Records `position` with the model in the elastic state: a failure rolls back to here."""
        assert self.elastic_state is not None
        self.elastic_state.epoch = position.epoch
        self.elastic_state.samples = self.progress.samples(position)
        self.elastic_state.commit()

    def check_replicas(self, epoch: int) -> None:
        """Every rank must hold the same trained weights and optimizer state, bit for bit. A
        difference means the replicas diverged (a bug in hvd_train, Horovod or the model's
        code), which would otherwise train on silently. Each rank hashes each tensor; the
        hashes, not the tensors, are gathered."""
        state = self.adapter.trained_state()
        digests = [hashlib.blake2b(np.ascontiguousarray(array).tobytes(), digest_size=8).digest()
                   for array in state.values()]  # fmt: skip
        everyone = self.adapter.allgather_object((list(state), digests))
        names, ours = everyone[0]  # rank 0's
        differing = [
            (name, rank)
            for index, name in enumerate(names)
            for rank, (their_names, theirs) in enumerate(everyone)
            if their_names != names or theirs[index] != ours[index]
        ]
        if differing:
            name, rank = differing[0]
            count = len({tensor for tensor, _ in differing})
            raise ReplicasDiverged(
                f"after epoch {epoch + 1}, rank {rank} holds another {name} than rank 0 ({count} "
                f"of {len(names)} tensors differ): the replicas diverged, which is a bug, and "
                "training stopped before saving this epoch; please report it with the run's "
                "command"
            )

    def end_epoch(self, epoch: int, train_loss: float, started: float) -> None:
        """Checks the replicas, then evaluates, logs and checkpoints the end of epoch `epoch`."""
        self.check_replicas(epoch)
        test_loss, accuracy = evaluate(self.adapter, self.data.test)
        end = Position(epoch + 1, 0)
        self.metrics.eval(epoch + 1, self.progress.global_step(end), self.examples(end),
                          test_loss, accuracy)  # fmt: skip
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

    def fit(self, start: Position) -> dict[str, Any]:
        """Trains from `start` to the recipe's last epoch; the run's summary."""
        self.last_eval = (float("nan"), float("nan"))
        started = time.perf_counter()
        with self.requests.catching_signals():
            for epoch in range(start.epoch, self.recipe.schedule.epochs):
                epoch_started = time.perf_counter()
                train_loss = self.run_epoch(epoch, start.step if epoch == start.epoch else 0)
                self.end_epoch(epoch, train_loss, epoch_started)
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
                state.epoch, state.samples = start.epoch, self.progress.samples(start)
                state.started = True
                state.save()
                state.sync()  # ...on every rank
            position = self.progress.position_at(state.epoch, state.samples)
            # Rank 0 may be new, on another host: give it the run's folder, without the records
            # of steps after the commit that the job went back to.
            self.adapter.on_rank_zero(lambda: self.reopen_output(position))
            return self.fit(position)

        assert isinstance(self.adapter, Elastic), "checked when the run started"
        return self.adapter.run_elastic(loop)

    def reopen_output(self, position: Position) -> None:
        try:
            self.checkpoint_dir.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise UsageError(write_error(self.checkpoint_dir, error)) from None
        self.metrics.keep_until(self.examples(position))

    def summary(self, seconds: float) -> dict[str, Any]:
        adapter, recipe = self.adapter, self.recipe
        # Per step on this rank, as step_ms: the passes, and the wait for the exchange after them.
        t_comp, t_sync = 1000 * self.step_parts / max(1, self.steps_trained)
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
            "images_per_second_basis": IMAGES_PER_SECOND_BASIS,
            "step_ms": round(1000 * self.step_seconds / max(1, self.steps_trained), 2),
            "t_comp_ms": round(float(t_comp), 2),
            "t_sync_ms": round(float(t_sync), 2),
            "hosts": dict(Counter(adapter.allgather_object(host_name()))),
            "hvd_train_version": __version__,
            "settings": recipe.settings_table(),  # the effective recipe
        }
        adapter.on_rank_zero(lambda: self.finish(summary))
        return summary

    def finish(self, summary: dict[str, Any]) -> None:
        """Rank 0 writes summary.json and draws the run's curves.png."""
        self.metrics.summary(summary)
        plot_runs([self.output_dir], self.output_dir / "curves.png")
