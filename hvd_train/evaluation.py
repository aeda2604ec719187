"""Evaluation over the whole test set, and `hvd-train eval` for any checkpoint."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from hvd_train.adapters import Adapter, create_adapter
from hvd_train.checkpoint import Checkpoint, load_checkpoint, resolve_checkpoint
from hvd_train.errors import UsageError
from hvd_train.mnist import Mnist, load_mnist
from hvd_train.recipe import parse_recipe
from hvd_train.sharding import eval_indices

EVAL_BATCH_SIZE = 1000


def evaluate(adapter: Adapter, data: Mnist) -> tuple[float, float]:
    """Test loss and accuracy; each rank takes its own slice, so every image counts once."""
    mine = eval_indices(len(data.test_labels), adapter.rank, adapter.world_size)
    loss_sum, correct = 0.0, 0
    for start in range(0, len(mine), EVAL_BATCH_SIZE):
        batch = mine[start : start + EVAL_BATCH_SIZE]
        batch_loss, batch_correct = adapter.eval_sums(
            data.test_images[batch], data.test_labels[batch]
        )
        loss_sum, correct = loss_sum + batch_loss, correct + batch_correct
    totals = adapter.allreduce_sum(np.array([loss_sum, correct, len(mine)]))
    return float(totals[0] / totals[2]), float(totals[1] / totals[2])


def read_checkpoint(path: Path) -> Checkpoint:
    """Rank 0's reading of a checkpoint given by the user (a checkpoint or a run directory)."""
    if not path.exists():
        raise UsageError(f"checkpoint {path} does not exist; check --checkpoint")
    return load_checkpoint(resolve_checkpoint(path))


def evaluate_checkpoint(path: Path, framework: str, data_dir: Path | None) -> dict[str, Any] | None:
    """Loads a checkpoint written by either framework into `framework` and evaluates it; the
    result on rank 0, None on the other ranks."""
    adapter = create_adapter(framework)
    adapter.init()
    # Only rank 0 need see the file (hosts may not share a disk); it sends the rest the contents.
    checkpoint = adapter.on_rank_zero(lambda: read_checkpoint(path))
    recipe = parse_recipe(
        checkpoint.recipe_text, checkpoint.state["recipe"], str(checkpoint.path / "recipe.toml")
    )
    data = load_mnist(data_dir)
    adapter.build(recipe, seed=0)
    adapter.load_weights(checkpoint.weights)
    test_loss, accuracy = evaluate(adapter, data)
    if not adapter.is_rank_zero:
        return None
    return {
        "checkpoint": str(checkpoint.path),
        "recipe": recipe.name,
        "framework": framework,
        "written_by": checkpoint.state["framework"],
        "world_size": adapter.world_size,
        "test_accuracy": accuracy,
        "test_loss": test_loss,
    }
