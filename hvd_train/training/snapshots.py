"""A run's checkpoints as the loop sees them: rank 0 saves a snapshot of a position (model,
optimizer, where the run stands) and loads one back to resume. The files themselves are
`checkpoint.py`'s; whether a checkpoint fits this run is `resume.py`'s to say."""

from __future__ import annotations

import math
import shutil
from pathlib import Path
from typing import Any

from hvd_train.checkpoint import (
    BEST,
    Checkpoint,
    best_checkpoints,
    checkpoint_name,
    save_checkpoint,
)
from hvd_train.distributed.layer import ModelState
from hvd_train.recipe.learning_rate import LearningRateSchedule
from hvd_train.recipe.toml import recipe_toml
from hvd_train.training.position import EpochPlan, Position
from hvd_train.training.resume import check_continues, optimizer_misfit
from hvd_train.training.run import Run
from hvd_train.version import __version__


class Snapshots:
    def __init__(self, run: Run, directory: Path, seed: int, limit_steps: int | None,
                 keep: int) -> None:  # fmt: skip
        self.run, self.directory, self.keep = run, directory, keep
        self.seed, self.limit_steps = seed, limit_steps

    def save(self, position: Position, plan: EpochPlan, schedule: LearningRateSchedule,
             callbacks: dict[str, Any]) -> Path:  # fmt: skip
        """Rank 0 writes a checkpoint of `position`, with what the `callbacks` keep; its path,
        on every rank. A failed write stops every rank with its message."""
        state = self.state(position, plan, schedule, callbacks)
        held = self.run.dist.saved_state()
        return self.run.dist.on_rank_zero(
            lambda: self.write(self.directory, position, plan, state, held, self.keep)
        )

    def save_if_best(
        self, position: Position, plan: EpochPlan, schedule: LearningRateSchedule, figure: float,
        callbacks: dict[str, Any],
    ) -> Path | None:  # fmt: skip
        """Rank 0 writes a checkpoint of `position` into the run's `best/` folder if `figure`
        ranks among the recipe's `keep_best` there, then drops the one that fell out; its path,
        on every rank, or None."""
        kept = self.run.recipe.checkpoints
        held = self.run.dist.saved_state()
        folder, sign = self.directory.parent / BEST, 1.0 if kept.mode == "min" else -1.0
        state = self.state(position, plan, schedule, callbacks) | {
            "monitored": {"name": kept.monitor, "value": figure, "mode": kept.mode}
        }

        def keep() -> Path | None:
            ranked = sorted(best_checkpoints(folder), key=lambda entry: sign * entry[1])
            full = len(ranked) >= kept.keep_best
            if not math.isfinite(figure) or (full and not sign * figure < sign * ranked[-1][1]):
                return None
            path = self.write(folder, position, plan, state, held, keep=len(ranked) + 1)
            for old, _ in ranked[kept.keep_best - 1 :]:
                if old != path:  # an evaluation of the same point again (an elastic rollback)
                    shutil.rmtree(old, ignore_errors=True)
            return path

        return self.run.dist.on_rank_zero(keep)

    def write(self, folder: Path, position: Position, plan: EpochPlan, state: dict[str, Any],
              held: ModelState | None, keep: int) -> Path:  # fmt: skip
        assert held is not None  # rank 0's, from saved_state
        return save_checkpoint(
            folder, checkpoint_name(position.epoch, plan.samples(position)),
            self.run.layout.to_saved(held.weights), held.optimizer, state,
            recipe_toml(self.run.recipe), keep,
        )  # fmt: skip

    def state(
        self, position: Position, plan: EpochPlan, schedule: LearningRateSchedule,
        callbacks: dict[str, Any],
    ) -> dict[str, Any]:  # fmt: skip
        """What state.json records of `position`, beside the tensors."""
        recipe, dist = self.run.recipe, self.run.dist
        return {
            "epoch": position.epoch,
            "step_in_epoch": position.step,
            "samples_in_epoch": plan.samples(position),
            "global_step": plan.global_step(position),
            "seed": self.seed,
            "limit_steps": self.limit_steps,
            "world_size": dist.world_size,
            "global_batch_size": plan.global_batch,
            "learning_rate": {
                "base": schedule.base,
                "peak": schedule.peak,
                "scaling": recipe.schedule.lr_scaling,
            },
            "recipe": recipe.name,
            "recipe_source": recipe.source,
            "recipe_hash": recipe.recipe_hash(),
            "layout": self.run.layout.name,
            "framework": dist.framework,
            "hvd_train_version": __version__,
            "callbacks": callbacks,
        }

    def load(self, checkpoint: Checkpoint, plan: EpochPlan) -> Position:
        """Loads `checkpoint` into rank 0's model and optimizer; where it stands."""
        state, dist = checkpoint.state, self.run.dist
        position = plan.position_at(state["epoch"], state["samples_in_epoch"])
        self.run.load_weights(checkpoint, "resume with that recipe or choose another --output-dir")
        check_continues(checkpoint, dist.framework, position, self.run.recipe.schedule.epochs,
                        self.directory.parent)  # fmt: skip
        try:
            dist.load_state(optimizer=checkpoint.optimizer)
        except (ValueError, KeyError, RuntimeError) as error:
            raise optimizer_misfit(checkpoint, error) from None
        print(f"hvd-train: resuming from {checkpoint.path}", flush=True)
        return position
