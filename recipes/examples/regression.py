"""Regression: float targets, the user's own MSE loss, and mse/mae as the metrics.

    horovodrun -np 2 python -m hvd_train --recipe recipes/examples/regression.py

A torch module maps 8 features to one number. The labels are floats (N,), so the default
`cross_entropy` does not fit: the recipe gives its own loss, in torch's tensors, and names the
metrics evaluation reports (summed over the whole test set across the ranks). Reached at np=2
in the test: test mse below 0.05, where predicting the mean scores about 1.9.
"""

import numpy as np

from hvd_train import Optimizer, Recipe, Schedule

FEATURES = 8


def target(x: np.ndarray) -> np.ndarray:
    """A smooth function of the first four features; the rest are noise to ignore."""
    return np.sin(2 * x[:, 0]) + x[:, 1] * x[:, 2] + 0.5 * x[:, 3] ** 2


def data():
    """((x_train, y_train), (x_test, y_test)): features (N, 8), float targets (N,)."""
    generator = np.random.default_rng(0)
    x = generator.normal(size=(20_001, FEATURES)).astype(np.float32)
    y = (target(x) + 0.1 * generator.normal(size=len(x))).astype(np.float32)
    return (x[:18000], y[:18000]), (x[18000:], y[18000:])


def model():
    from torch import nn

    return nn.Sequential(
        nn.Linear(FEATURES, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1)
    )


def squared_error(outputs, labels):
    """The mean loss of a batch: outputs (N, 1) against targets (N,)."""
    return ((outputs[:, 0] - labels) ** 2).mean()


recipe = Recipe(
    data=data,
    torch_model=model,
    loss=squared_error,
    metrics=("mse", "mae"),
    optimizer=Optimizer(name="adam", learning_rate=0.003),
    schedule=Schedule(epochs=20, batch_size=64, decay="cosine"),
)
