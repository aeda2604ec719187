"""Evaluation over the whole test set, each example counted once across the ranks: the loss and
the recipe's metrics (`scoring.py`), each reduced as a sum and a count."""

from __future__ import annotations

from typing import Any

import numpy as np

from hvd_train.data import ArrayDataset, Dataset, Transformed, batch_size, take
from hvd_train.distributed import Distributed
from hvd_train.errors import UsageError
from hvd_train.recipe import Recipe
from hvd_train.recipe.scoring import CLASS_METRICS, Metric

EVAL_BATCH_SIZE = 1000


def evaluate(dist: Distributed, test: Dataset, metrics: dict[str, Metric]) -> dict[str, float]:
    """The test loss and each metric by name, with rank 0's running statistics; each rank
    takes its own slice (uneven, never padded), so every example counts once."""
    dist.exchange.sync_buffers()
    sums = np.zeros(2 + 2 * len(metrics))  # the loss's sum and count, then each metric's
    loader = dist.loader(test, EVAL_BATCH_SIZE, shuffle=False, workers=0)
    for [(x, y)] in loader.step_batches():
        loss, outputs = dist.exchange.eval_batch(x, y)
        sums += [loss, batch_size(x), *(part for metric in metrics.items()
                                 for part in _summed(*metric, outputs, y))]  # fmt: skip
    totals = dist.all_reduce(sums, op="sum")
    figures = totals[0::2] / np.maximum(totals[1::2], 1)
    return dict(zip(["loss", *metrics], map(float, figures), strict=True))


def _summed(name: str, metric: Metric, outputs: np.ndarray, labels: Any) -> tuple[float, float]:
    returned = metric(outputs, labels)
    try:
        total, count = returned
        return float(total), float(count)
    except (TypeError, ValueError):
        raise UsageError(
            f"metric {name} returned {returned!r}; a metric returns (sum, count) over its batch, "
            "such as (number correct, number of labels)"
        ) from None


def check_outputs_fit(dist: Distributed, recipe: Recipe, train: Dataset) -> None:
    """Before training, the model's outputs on two examples against what the loss and the
    metrics need of them, so that a mismatch is one line now, not a traceback (or a wrong
    figure) later: class scores (N, ..., C) for labels (N, ...) below C; for mse and mae,
    as many outputs as labels; from every metric, a sum and a count. The examples pass
    through the deterministic transforms (a resize) as they will in training."""
    evaluation = recipe.transforms().evaluation
    examples = Transformed(train, evaluation) if evaluation else train
    x, y = take(examples, np.arange(min(2, len(train))))
    if isinstance(x, dict):
        check_input_names(sorted(x), dist.exchange.input_names())
    outputs, names = dist.exchange.eval_batch(x)[1], set(recipe.metric_functions)
    if recipe.loss == "cross_entropy" or names & set(CLASS_METRICS):
        if isinstance(y, tuple) or outputs.shape[:-1] != y.shape:
            raise UsageError(
                f"the model gives outputs {_shape(outputs)} for labels {_shape(y)}; "
                "cross_entropy and accuracy take class scores (N, ..., C) for integer labels "
                "(N, ...): give the model a last axis of one score per class"
            )
        labels = train.y if isinstance(train, ArrayDataset) else y
        if labels.min() < 0 or labels.max() >= outputs.shape[-1]:
            raise UsageError(
                f"the labels run from {labels.min()} to {labels.max()}, and the model scores "
                f"{outputs.shape[-1]} classes (0 to {outputs.shape[-1] - 1}); give it one "
                "output per class"
            )
    for name in sorted(names & {"mse", "mae"}):
        if isinstance(y, tuple) or outputs.size != y.size:
            raise UsageError(
                f"{name} compares outputs {_shape(outputs)} with labels {_shape(y)} element by "
                "element; give the model one output per label value"
            )
    for name, metric in recipe.metric_functions.items():
        _summed(name, metric, outputs, y)


def check_input_names(given: list[str], taken: tuple[str, ...] | None) -> None:
    """The data's named inputs against the names the model takes them by (None: any)."""
    if taken is None or set(given) <= set(taken):
        return
    raise UsageError(
        f"the data's inputs are named {', '.join(given)}, and the model takes "
        f"{', '.join(taken) or 'no named inputs'}; name the data's columns as the model's "
        "inputs (dataset.rename_column), or give it one input column of one shape"
    )


def _shape(array: Any) -> str:
    if isinstance(array, tuple):
        return " and ".join(_shape(part) for part in array)
    return str(("N", *array.shape[1:])).replace("'", "")
