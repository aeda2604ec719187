"""The learning rate: scaled with the world size, warmed up, then decayed."""

from __future__ import annotations

import math
from dataclasses import dataclass

from hvd_train.recipe.settings import Schedule


def scaled_learning_rate(base: float, scale: int, rule: str) -> float:
    """The recipe's one-process learning rate, for a global batch `scale` times the recipe's
    batch (world size x backward passes per step).

    "linear" follows Goyal et al. and Horovod's examples (the global batch grows with the world
    size, so does the step); "sqrt" is gentler, for adaptive optimizers at large scale.
    """
    factor = {"linear": scale, "sqrt": math.sqrt(scale), "none": 1.0}[rule]
    return base * factor


@dataclass(frozen=True)
class LearningRateSchedule:
    base: float  # the recipe's learning rate, where warmup starts
    peak: float  # the scaled learning rate, reached after warmup
    warmup_steps: int
    total_steps: int
    decay: str

    @classmethod
    def from_recipe(
        cls, schedule: Schedule, base: float, scale: int, steps_per_epoch: int
    ) -> LearningRateSchedule:
        """The schedule in optimizer steps, for a global batch `scale` times the recipe's."""
        return cls(
            base=base,
            peak=scaled_learning_rate(base, scale, schedule.lr_scaling),
            warmup_steps=round(schedule.warmup_epochs * steps_per_epoch),
            total_steps=schedule.epochs * steps_per_epoch,
            decay=schedule.decay,
        )

    def __call__(self, step: int) -> float:
        """The learning rate for global step `step` (0-based)."""
        if step < self.warmup_steps:
            return self.base + (self.peak - self.base) * step / self.warmup_steps
        if self.decay == "none":
            return self.peak
        progress = (step - self.warmup_steps) / max(1, self.total_steps - self.warmup_steps)
        return self.peak * 0.5 * (1.0 + math.cos(math.pi * progress))
