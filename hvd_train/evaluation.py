"""Evaluation over the whole test set, each example counted once across the ranks."""

from __future__ import annotations

import numpy as np

from hvd_train.adapters import Adapter
from hvd_train.data import Dataset, take
from hvd_train.data.sharding import eval_indices

EVAL_BATCH_SIZE = 1000


def evaluate(adapter: Adapter, test: Dataset) -> tuple[float, float]:
    """Test loss and accuracy with rank 0's running statistics; each rank takes its own slice,
    so every example counts once."""
    adapter.sync_buffers()
    mine = eval_indices(len(test), adapter.rank, adapter.world_size)
    loss_sum, correct = 0.0, 0
    for first in range(0, len(mine), EVAL_BATCH_SIZE):
        batch_loss, batch_correct = adapter.eval_sums(
            *take(test, mine[first : first + EVAL_BATCH_SIZE])
        )
        loss_sum, correct = loss_sum + batch_loss, correct + batch_correct
    totals = adapter.allreduce_sum(np.array([loss_sum, correct, len(mine)]))
    return float(totals[0] / totals[2]), float(totals[1] / totals[2])
