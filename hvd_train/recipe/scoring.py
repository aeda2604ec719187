"""The metrics a recipe can name, besides its loss, and how each is summed.

A metric is a function `(outputs, labels) -> (sum, count)` on NumPy arrays: the model's outputs
(fp32) and the labels as the data gives them (a tuple, for several targets). Every rank sums
over its own slice of the test set, and the sums and counts are added across the ranks before
one division, so the figure is exactly what one process would compute over the whole set.
NumPy keeps one definition for both frameworks, and a recipe's own metric runs under either.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

Metric = Callable[[Any, Any], tuple[Any, Any]]
TOP_K = 5  # top_k_accuracy's k, Keras's default


def accuracy(outputs: np.ndarray, labels: np.ndarray) -> tuple[int, int]:
    """Whether the largest output is the label's class; per position for labels (N, ...)."""
    return int((outputs.argmax(axis=-1) == labels).sum()), labels.size


def top_k_accuracy(outputs: np.ndarray, labels: np.ndarray) -> tuple[int, int]:
    """Whether the label's class is among the TOP_K largest outputs."""
    k = min(TOP_K, outputs.shape[-1])
    top = np.argpartition(-outputs, k - 1, axis=-1)[..., :k]
    return int((top == labels[..., None]).any(axis=-1).sum()), labels.size


def mse(outputs: np.ndarray, labels: np.ndarray) -> tuple[float, int]:
    """Mean squared error over every element (labels (N,) for outputs (N, 1) too)."""
    error = outputs.astype(np.float64) - labels.reshape(outputs.shape)
    return float((error * error).sum()), error.size


def mae(outputs: np.ndarray, labels: np.ndarray) -> tuple[float, int]:
    """Mean absolute error over every element (labels (N,) for outputs (N, 1) too)."""
    error = outputs.astype(np.float64) - labels.reshape(outputs.shape)
    return float(np.abs(error).sum()), error.size


BUILT_IN: dict[str, Metric] = {
    "accuracy": accuracy,
    "top_k_accuracy": top_k_accuracy,
    "mse": mse,
    "mae": mae,
}
CLASS_METRICS = ("accuracy", "top_k_accuracy")  # outputs (N, ..., C) for integer labels (N, ...)
PERCENT = CLASS_METRICS  # shown as percentages
NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]*")


def metric_name(metric: str | Metric) -> str:
    """The name a metric is recorded by: a built-in's, or a function's own."""
    return metric if isinstance(metric, str) else str(getattr(metric, "__name__", ""))


def describe(results: Mapping[str, float], split: str = "test") -> str:
    """`test loss 0.0312, test accuracy 99.05%`: an evaluation's figures (the loss and each
    metric, by name) on `split` ("test" or "val") as a progress line shows them."""
    return ", ".join(
        f"{split} {name.replace('_', ' ')} {value:.2%}" if name in PERCENT
        else f"{split} {name.replace('_', ' ')} {value:.4f}"
        for name, value in results.items()
    )  # fmt: skip


def evaluation_figures(summary: dict[str, Any]) -> dict[str, float]:
    """The evaluation's figures in a summary.json or an eval result, by name."""
    return {key[5:]: value for key, value in summary.items() if key.startswith("test_")}
