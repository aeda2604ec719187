"""`hvd-train eval`: any checkpoint, under either framework for a neutral recipe."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hvd_train.distributed import Distributed, Found
from hvd_train.errors import UsageError
from hvd_train.recipe import load_data
from hvd_train.training.evaluation import check_outputs_fit, evaluate
from hvd_train.training.resume import check_layout, saved_recipe
from hvd_train.training.run import Run, open_run, start


def read_checkpoint(dist: Distributed, path: Path) -> Found:
    """The checkpoint a user gave (a checkpoint, a run's best/ folder, or a run directory: its
    newest sound one), read by rank 0 (hosts may not share a disk)."""
    if not path.exists():
        raise UsageError(f"checkpoint {path} does not exist; check --checkpoint")
    found = dist.checkpoints.find(path)
    if found is None:
        raise UsageError(
            f"{path} is neither a checkpoint nor a run directory holding one; "
            "pass a checkpoint (checkpoints/epoch-...) of a run, or its --output-dir"
        )
    return found


def load_weights(run: Run, found: Found, remedy: str) -> None:
    """`found`'s weights into `run`'s model, on every rank, once they are known to fit it;
    `remedy` is what the line of a checkpoint of another model tells the user to do."""
    check_layout(found, run.dist.framework, run.layout.name)
    run.dist.checkpoints.load(found, remedy=remedy, optimizer=False)


def evaluate_checkpoint(
    path: Path, framework: str, data_dir: Path | None, recipe_reference: str | None = None
) -> dict[str, Any] | None:
    """Loads a checkpoint into `framework` and evaluates it; the result on rank 0, None on the
    other ranks. Neutral checkpoints load under either framework."""
    dist = start(framework)
    found = read_checkpoint(dist, path)
    recipe = saved_recipe(found, recipe_reference)
    data = load_data(recipe, data_dir)
    run = open_run(dist, recipe, seed=0, trains=False)
    load_weights(run, found, "evaluate it with the recipe that wrote it")
    check_outputs_fit(dist, recipe, data.test)
    results = evaluate(dist, data.test, recipe.metric_functions)
    if not dist.is_rank_zero:
        return None
    return {
        "checkpoint": str(found.path),
        "recipe": recipe.name,
        "framework": framework,
        "written_by": found.state["framework"],
        "world_size": dist.world_size,
        **{f"test_{name}": value for name, value in results.items()},
    }
