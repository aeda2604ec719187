"""mnist_cnn's model and recipe on a training set memory-mapped from the two .npy files in
$HVD_TRAIN_BENCH_ARRAYS (x.npy: N x 28 x 28 x 1 float32, y.npy: N int64), as a Python recipe's
own arrays, with MNIST's test set; for benchmarks.memory."""

import os
from pathlib import Path

import numpy as np

from hvd_train import Recipe
from hvd_train.recipe import load_data, load_recipe

MNIST_CNN = load_recipe("mnist_cnn")
SHAPE = (28, 28, 1)


def data():
    folder = Path(os.environ["HVD_TRAIN_BENCH_ARRAYS"])
    x, y = (np.load(folder / name, mmap_mode="r") for name in ("x.npy", "y.npy"))
    directory = os.environ.get("HVD_TRAIN_DATA_DIR")
    test = load_data(MNIST_CNN, Path(directory) if directory else None).test
    return (x, y), test[np.arange(len(test))]


def torch_model():
    from hvd_train.builders import torch_layers

    return torch_layers.build_neutral(MNIST_CNN.layers, SHAPE).model


recipe = Recipe(
    data=data,
    torch_model=torch_model,
    optimizer=MNIST_CNN.optimizer,
    schedule=MNIST_CNN.schedule,
    description="mnist_cnn on memory-mapped arrays",
)
