"""A Python recipe whose training examples sit behind a source that waits 10 ms on every read,
as network storage does: `data.workers` decides whether the step waits for it. The read of
example $HVD_TRAIN_TEST_HANG, where it is set, never ends, as on a stalled mount."""

import os
import time

import numpy as np

from hvd_train import Optimizer, Recipe, Schedule

FEATURES, CLASSES = 16, 4


class SlowSource:
    def __init__(self, x: np.ndarray, y: np.ndarray) -> None:
        self.x, self.y = x, y

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, indices):
        if str(os.environ.get("HVD_TRAIN_TEST_HANG")) in map(str, indices):
            time.sleep(3600)
        time.sleep(0.01)
        return self.x[indices], self.y[indices]


def data():
    generator = np.random.default_rng(0)
    x = generator.normal(size=(1024 + 256, FEATURES)).astype(np.float32)
    y = np.argmax(x[:, :CLASSES], axis=1)
    return SlowSource(x[:1024], y[:1024]), (x[1024:], y[1024:])


def torch_model():
    from torch import nn

    return nn.Sequential(nn.Linear(FEATURES, 32), nn.ReLU(), nn.Linear(32, CLASSES))


def keras_model():
    import keras

    return keras.Sequential(
        [keras.Input((FEATURES,)), keras.layers.Dense(32, activation="relu"),
         keras.layers.Dense(CLASSES)]
    )  # fmt: skip


recipe = Recipe(
    data=data,
    torch_model=torch_model,
    keras_model=keras_model,
    optimizer=Optimizer(name="adam", learning_rate=0.01),
    schedule=Schedule(epochs=2, batch_size=16),
)
