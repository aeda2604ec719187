"""Where training stands, and the arithmetic between steps, samples and epochs.

A position is world-size-free when counted in samples: checkpoint names, resume and the elastic
state use samples, and each world size turns them back into steps.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from hvd_train.data.sharding import steps_per_epoch
from hvd_train.recipe import Horovod, Schedule


@dataclass(frozen=True)
class Position:
    """`step` steps into epoch `epoch` (both counted from 0)."""

    epoch: int
    step: int


@dataclass(frozen=True)
class EpochPlan:
    """How steps map to samples for one world size."""

    steps_per_epoch: int
    global_batch: int  # samples per step, across all ranks

    @classmethod
    def for_world(
        cls, train_size: int, world_size: int, schedule: Schedule, horovod: Horovod,
        limit_steps: int | None,
    ) -> EpochPlan:  # fmt: skip
        """Steps of `horovod.backward_passes_per_step` batches of `schedule.batch_size` on each
        of `world_size` ranks; `limit_steps` caps the steps per epoch (smoke runs)."""
        passes = horovod.backward_passes_per_step
        steps = steps_per_epoch(train_size, world_size, schedule.batch_size, passes)
        global_batch = schedule.batch_size * world_size * passes
        return cls(min(steps, limit_steps or sys.maxsize), global_batch)

    def samples(self, position: Position) -> int:
        """Training samples consumed, across all ranks, in the epoch of `position`."""
        return position.step * self.global_batch

    def position_at(self, epoch: int, samples: int) -> Position:
        """Where `samples` into `epoch` falls with this world size (it may have changed)."""
        return Position(epoch, min(samples // self.global_batch, self.steps_per_epoch))

    def global_step(self, position: Position) -> int:
        return position.epoch * self.steps_per_epoch + position.step
