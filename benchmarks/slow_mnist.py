"""mnist_cnn's model and recipe on the first $HVD_TRAIN_BENCH_EXAMPLES of MNIST's training set,
behind a source whose every read waits $HVD_TRAIN_BENCH_WAIT_MS (a stand-in for network
storage; 0: none), as a Python recipe's own data, for benchmarks.data."""

import os
import time
from pathlib import Path

import numpy as np

from hvd_train import Recipe
from hvd_train.recipe import load_data, load_recipe

MNIST_CNN = load_recipe("mnist_cnn")
SHAPE = (28, 28, 1)


class Waiting:
    """MNIST's arrays, each read `wait` seconds late."""

    def __init__(self, x: np.ndarray, y: np.ndarray, wait: float) -> None:
        self.x, self.y, self.wait = x, y, wait

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, indices: np.ndarray):
        time.sleep(self.wait)
        return self.x[indices], self.y[indices]


def data():
    directory = os.environ.get("HVD_TRAIN_DATA_DIR")
    splits = load_data(MNIST_CNN, Path(directory) if directory else None)
    count = int(os.environ.get("HVD_TRAIN_BENCH_EXAMPLES", "30000"))
    x, y = splits.train[np.arange(count)]
    wait = float(os.environ.get("HVD_TRAIN_BENCH_WAIT_MS", "10")) / 1000
    return Waiting(x, y, wait), splits.test[np.arange(len(splits.test))]


def torch_model():
    from hvd_train.builders import torch_layers

    return torch_layers.build_neutral(MNIST_CNN.layers, SHAPE).model


def keras_model():
    from hvd_train.builders import keras_models

    return keras_models.build_neutral(MNIST_CNN.layers, SHAPE).model


recipe = Recipe(
    data=data,
    torch_model=torch_model,
    keras_model=keras_model,
    optimizer=MNIST_CNN.optimizer,
    schedule=MNIST_CNN.schedule,
    description="mnist_cnn behind a slow source",
)
