"""Where training stands, and the arithmetic between steps, samples and epochs.

A position is world-size-free when counted in samples: checkpoint names, resume and the elastic
state use samples, and each world size turns them back into steps.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Position:
    """`step` steps into epoch `epoch` (both counted from 0)."""

    epoch: int
    step: int


@dataclass(frozen=True)
class EpochPlan:
    """How steps map to samples for one world size: the training loader's steps per epoch and
    examples per step (`Loader.steps`, `Loader.global_batch`)."""

    steps_per_epoch: int
    global_batch: int  # samples per step, across all ranks

    def samples(self, position: Position) -> int:
        """Training samples consumed, across all ranks, in the epoch of `position`."""
        return position.step * self.global_batch

    def position_at(self, epoch: int, samples: int) -> Position:
        """Where `samples` into `epoch` falls with this world size (it may have changed)."""
        return Position(epoch, min(samples // self.global_batch, self.steps_per_epoch))

    def global_step(self, position: Position) -> int:
        return position.epoch * self.steps_per_epoch + position.step
