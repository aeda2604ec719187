"""`hvd-train eval`: any checkpoint, under either framework for a neutral recipe."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hvd_train.checkpoint import Checkpoint, load_checkpoint, resolve_checkpoint
from hvd_train.data import load_data
from hvd_train.errors import UsageError
from hvd_train.training.evaluation import check_outputs_fit, evaluate
from hvd_train.training.resume import saved_recipe
from hvd_train.training.run import open_run, start


def read_checkpoint(path: Path) -> Checkpoint:
    """Rank 0's reading of a checkpoint given by the user (a checkpoint or a run directory)."""
    if not path.exists():
        raise UsageError(f"checkpoint {path} does not exist; check --checkpoint")
    return load_checkpoint(resolve_checkpoint(path))


def evaluate_checkpoint(
    path: Path, framework: str, data_dir: Path | None, recipe_reference: str | None = None
) -> dict[str, Any] | None:
    """Loads a checkpoint into `framework` and evaluates it; the result on rank 0, None on the
    other ranks. Neutral checkpoints load under either framework."""
    dist = start(framework)
    # Only rank 0 need see the file (hosts may not share a disk); it sends the rest the contents.
    checkpoint = dist.on_rank_zero(lambda: read_checkpoint(path))
    state = checkpoint.state | {"path": str(checkpoint.path)}
    recipe = saved_recipe(state, checkpoint.recipe_text, recipe_reference)
    data = load_data(recipe, data_dir)
    run = open_run(dist, recipe, seed=0, trains=False)
    run.load_weights(checkpoint, "evaluate it with the recipe that wrote it")
    check_outputs_fit(dist, recipe, data.test)
    results = evaluate(dist, data.test, recipe.metric_functions)
    if not dist.is_rank_zero:
        return None
    return {
        "checkpoint": str(checkpoint.path),
        "recipe": recipe.name,
        "framework": framework,
        "written_by": checkpoint.state["framework"],
        "world_size": dist.world_size,
        **{f"test_{name}": value for name, value in results.items()},
    }
