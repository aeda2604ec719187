"""What happens at a step's or an epoch's end besides training: progress and records, mid-epoch
and end-of-epoch checkpoints, elastic commits, the replica check, the evaluation. The loop
calls each hook in turn; every rank calls the same hooks, so their collectives match."""

from __future__ import annotations

import hashlib
import time
from typing import TYPE_CHECKING

import numpy as np
from tqdm import tqdm

from hvd_train.adapters.base import StepResult
from hvd_train.errors import ReplicasDiverged
from hvd_train.evaluation import evaluate
from hvd_train.options import RunOptions
from hvd_train.position import Position
from hvd_train.progress import EpochProgress
from hvd_train.scoring import describe

if TYPE_CHECKING:
    from hvd_train.trainer import Trainer

DATA_WAIT_SHARE = 0.1  # of the steps' time, waiting for batches, that Progress points out


class Hook:
    """Does nothing; a hook overrides what it needs."""

    def before_epoch(self, trainer: Trainer, epoch: int, first_step: int) -> None:
        """Epoch `epoch` (from 0) starts at step `first_step` (not 0 after a resume)."""

    def after_step(self, trainer: Trainer, done: Position, result: StepResult) -> None:
        """A step ended at `done`, every rank agreeing that training goes on."""

    def after_epoch(self, trainer: Trainer, epoch: int, train_loss: float) -> None:
        """Epoch `epoch` is trained; `train_loss` is its loss averaged over ranks and steps."""


class Reporting(Hook):
    """Rank 0's progress bar (or plain lines) and its metrics records: every `every` steps and
    at the epoch's end, the mean loss of the steps since the last record, and their speed."""

    def __init__(self, every: int) -> None:
        self.every = every
        self.losses: list[float] = []
        self.bar = EpochProgress("", 0, 0, False)
        self.records = 0
        self.said_data_waits = False

    def before_epoch(self, trainer: Trainer, epoch: int, first_step: int) -> None:
        label = f"epoch {epoch + 1}/{trainer.recipe.schedule.epochs}"
        steps = trainer.plan.steps_per_epoch
        self.bar = EpochProgress(label, first_step, steps, trainer.adapter.is_rank_zero)
        self.losses = []

    def after_step(self, trainer: Trainer, done: Position, result: StepResult) -> None:
        self.losses.append(result.loss)
        if len(self.losses) == self.every or done.step == trainer.plan.steps_per_epoch:
            self.record(trainer, done)
        self.bar.step(done.step)

    def record(self, trainer: Trainer, done: Position) -> None:
        images, seconds = trainer.throughput.since_last_record()
        step = trainer.plan.global_step(done) - 1
        average = float(np.mean(self.losses))
        rates = [trainer.schedule(s) for s in range(step + 1 - len(self.losses), step + 1)]
        speed = images / max(seconds, 1e-9)
        self.bar.show(loss=f"{average:.4f}", lr=f"{rates[-1]:.2e}", images_per_s=f"{speed:.0f}")
        trainer.metrics.train(done.epoch + 1, step + 1, trainer.examples(done), average, rates,
                              speed, 1000 * seconds / len(self.losses))  # fmt: skip
        self.losses = []
        self.records += 1
        self.say_if_data_waits(trainer)

    def say_if_data_waits(self, trainer: Trainer) -> None:
        """Once, on rank 0, from the second record on (the first holds the workers' start):
        the steps waited for their batches for more than a tenth of their time."""
        share = trainer.throughput.data_share()
        if self.said_data_waits or self.records < 2 or share <= DATA_WAIT_SHARE:
            return
        self.said_data_waits = True
        if trainer.adapter.is_rank_zero:
            tqdm.write(
                f"hvd-train: the steps waited for their batches {100 * share:.0f}% of the time "
                f"with {trainer.workers} data workers; read further ahead with more "
                "(--set data.workers=N, [data] workers in the recipe) or from faster storage"
            )

    def after_epoch(self, trainer: Trainer, epoch: int, train_loss: float) -> None:
        self.bar.close()


class MidEpochCheckpoints(Hook):
    """A checkpoint every `every` global steps within an epoch (its end saves one anyway)."""

    def __init__(self, every: int) -> None:
        self.every = every

    def after_step(self, trainer: Trainer, done: Position, result: StepResult) -> None:
        step = trainer.plan.global_step(done)
        if step % self.every == 0 and done.step < trainer.plan.steps_per_epoch:
            trainer.save_snapshot(done)


class ReplicaCheck(Hook):
    """Every rank must hold the same trained weights and optimizer state, bit for bit. A
    difference means the replicas diverged (a bug in hvd_train, Horovod or the model's code),
    which would otherwise train on silently. Each rank hashes each tensor; the hashes, not the
    tensors, are gathered. Before the evaluation, so a diverged epoch is never saved."""

    def after_epoch(self, trainer: Trainer, epoch: int, train_loss: float) -> None:
        state = trainer.adapter.trained_state()
        digests = [hashlib.blake2b(np.ascontiguousarray(array).tobytes(), digest_size=8).digest()
                   for array in state.values()]  # fmt: skip
        everyone = trainer.adapter.allgather_object((list(state), digests))
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


class Evaluation(Hook):
    """The test set's loss and the recipe's metrics at each epoch's end, recorded, then
    checkpointed with the epoch, then shown in one line on rank 0."""

    def before_epoch(self, trainer: Trainer, epoch: int, first_step: int) -> None:
        self.started = time.perf_counter()

    def after_epoch(self, trainer: Trainer, epoch: int, train_loss: float) -> None:
        results = evaluate(trainer.adapter, trainer.data.test, trainer.recipe.metric_functions)
        end = Position(epoch + 1, 0)
        trainer.metrics.eval(epoch + 1, trainer.plan.global_step(end), trainer.examples(end),
                             results)  # fmt: skip
        trainer.last_eval = results
        trainer.save_snapshot(end)
        if trainer.elastic_state:
            trainer.commit(end)
        if trainer.adapter.is_rank_zero:
            tqdm.write(
                f"epoch {epoch + 1}/{trainer.recipe.schedule.epochs}: train loss "
                f"{train_loss:.4f}, {describe(results)} "
                f"({time.perf_counter() - self.started:.1f} s)"
            )


class ElasticCommits(Hook):
    """Under the elastic driver, a commit every `every` global steps: a failure rolls back to
    the last one."""

    def __init__(self, every: int) -> None:
        self.every = every

    def after_step(self, trainer: Trainer, done: Position, result: StepResult) -> None:
        if trainer.elastic_state and trainer.plan.global_step(done) % self.every == 0:
            trainer.commit(done)


def default_hooks(options: RunOptions) -> list[Hook]:
    """The hooks of a training run, in the order the loop calls them."""
    hooks: list[Hook] = [Reporting(options.log_every)]
    if options.checkpoint_every:
        hooks.append(MidEpochCheckpoints(options.checkpoint_every))
    if options.elastic:
        hooks.append(ElasticCommits(options.commit_every))
    return [*hooks, ReplicaCheck(), Evaluation()]
