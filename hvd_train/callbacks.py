"""Callbacks: a recipe's own code at the training loop's events (`Recipe(callbacks=[...])`).

    class StopAboveLoss(hvd_train.Callback):
        def on_evaluate(self, state, metrics):
            if metrics["test_loss"] > 1.0:
                state.request_stop()

Every rank calls every callback, with a read-only `State`. The loop's own work at those events
(records and progress, checkpoints, the replica check, elastic commits) is made of the same
observers, which run before the recipe's (`observers.py`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class State:
    """Where training stands, as a callback sees it. `epoch` counts from 0 (the epoch under
    way, or the one that just ended); `step` is the optimizer steps done since the run began;
    `metrics` the latest figures: `loss` and `learning_rate` of the last step (at an epoch's
    end, its mean loss), and the last evaluation's `test_<name>`. `model` is the framework's
    model being trained (a torch module or a Keras model): read it, do not change it."""

    rank: int
    world_size: int
    epoch: int
    step: int
    metrics: Mapping[str, float]
    model: Any
    _stop: Callable[[], None] = field(repr=False, compare=False)

    def request_stop(self) -> None:
        """Ends training after this event: every rank stops at the same step, saves a
        checkpoint there, evaluates and writes its summary as at a normal end. Asked within an
        epoch (at a step's end, or an evaluation or checkpoint between steps), the request
        travels with the next step's gradients (no collective of its own), so every rank stops
        after that next step; asked at an epoch's end or the start of training, right there."""
        self._stop()


class Callback:
    """Does nothing until a method is overridden. A callback that raises stops training on
    every rank, with a checkpoint and a line naming the callback and the event."""

    def on_train_start(self, state: State) -> None:
        """Training starts (or resumes: `state.step` says where)."""

    def on_epoch_start(self, state: State) -> None:
        """Epoch `state.epoch` starts (part way through, on a resume)."""

    def on_step_end(self, state: State) -> None:
        """An optimizer step ended; `state.metrics` holds its loss and learning rate."""

    def on_epoch_end(self, state: State) -> None:
        """An epoch ended, evaluated; its checkpoint is saved."""

    def on_evaluate(self, state: State, metrics: Mapping[str, float]) -> None:
        """An evaluation's figures, reduced across the ranks (the same on every rank)."""

    def on_checkpoint(self, state: State, path: Path) -> None:
        """Rank 0 saved a checkpoint at `path` (every rank is told)."""

    def on_train_end(self, state: State) -> None:
        """Training ended, at the last epoch or at a requested stop."""

    def state_dict(self) -> dict[str, Any]:
        """What this callback keeps across a resume, in values JSON holds (numbers, strings,
        lists, tables): rank 0's is saved with each checkpoint, and a resumed run hands it to
        every rank's `load_state_dict` before training goes on. Default: nothing."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Takes back what `state_dict` returned when the checkpoint was saved."""
