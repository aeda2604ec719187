"""Python recipes that go wrong: at step 13 of every rank, for the tests of non-finite numbers,
and on rank 1 alone (`split_replicas`), for the replica check.

`recipe`: a Keras model (both frameworks) whose training inputs turn to NaN at the 13th batch a
rank asks for, so the loss becomes NaN. Its hidden layer is tanh, not relu: TensorFlow's oneDNN
kernels fuse a dense layer with its relu, and the fused relu turns NaN into 0 (the loss stays
finite there, and only the gradients show the NaN). `nan_gradients` (torch): the loss stays
finite from step 13 on, but its gradients are NaN.
"""

import numpy as np

from hvd_train import Recipe, Schedule

TURNS_AT = 13


def corner_squares():
    """Four classes: a bright square in one corner of a 12x12 image, on noise."""
    rng = np.random.default_rng(1)
    parts = []
    for count in (2000, 400):
        labels = rng.integers(0, 4, count)
        images = rng.uniform(0, 0.3, (count, 12, 12, 1)).astype(np.float32)
        for label, (row, col) in enumerate([(1, 1), (1, 7), (7, 1), (7, 7)]):
            images[labels == label, row : row + 4, col : col + 4] += 0.6
        parts.append((images, labels))
    return tuple(parts)


class TurnsToNaN:
    """The training set, as a dataset object that returns NaN from its 13th training batch on
    (the two examples hvd_train checks the labels and the outputs on, before training, are
    not a batch)."""

    def __init__(self, x: np.ndarray, y: np.ndarray) -> None:
        self.x, self.y, self.batches = x, y, 0

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, indices):
        self.batches += len(indices) > 2
        x = self.x[indices]
        return (np.full_like(x, np.nan) if self.batches >= TURNS_AT else x), self.y[indices]


def nan_data():
    (x, y), test = corner_squares()
    return TurnsToNaN(x, y), test


def keras_mlp():
    import keras

    layers = keras.layers
    return keras.Sequential(
        [keras.Input((12, 12, 1)), layers.Flatten(), layers.Dense(32, "tanh"), layers.Dense(4)]
    )


def torch_mlp():
    from torch import nn

    return nn.Sequential(nn.Flatten(), nn.Linear(144, 32), nn.ReLU(), nn.Linear(32, 4))


calls = [0]


def loss_with_nan_gradients(logits, labels):
    """Cross-entropy, plus from the 13th training step on a term whose value is 0 but whose
    gradient is NaN (0 x d sqrt(x)/dx at 0)."""
    import torch
    import torch.nn.functional as F

    loss = F.cross_entropy(logits, labels)
    if torch.is_grad_enabled():  # training, not evaluation
        calls[0] += 1
        if calls[0] >= TURNS_AT:
            loss = loss + 0.0 * torch.sqrt(logits.sum() * 0.0)
    return loss


recipe = Recipe(data=nan_data, keras_model=keras_mlp, schedule=Schedule(batch_size=32))
nan_gradients = Recipe(
    data=corner_squares, torch_model=torch_mlp, loss=loss_with_nan_gradients,
    schedule=Schedule(batch_size=32),
)  # fmt: skip


def keras_mlp_nudged_on_rank_one():
    """keras_mlp after a layer that adds a trained offset to its inputs, and that also nudges
    that offset at every training step behind Horovod's back: by 0 on rank 0, by 1e-3 on rank
    1. (Both ranks run the same ops, so TensorFlow's graphs, whose op names name Horovod's
    collectives, stay alike.)"""
    import os

    import keras

    nudge = 1e-3 * int(os.environ.get("HOROVOD_RANK", "0"))

    class Offset(keras.layers.Layer):
        def build(self, input_shape):
            self.offset = self.add_weight(shape=input_shape[-1:], initializer="zeros")

        def call(self, x, training=False):
            if training:
                self.offset.assign_add(keras.ops.full(self.offset.shape, nudge))
            return x + self.offset

    layers = keras.layers
    return keras.Sequential([keras.Input((12, 12, 1)), layers.Flatten(), Offset(),
                             layers.Dense(32, "tanh"), layers.Dense(4)])  # fmt: skip


split_replicas = Recipe(
    data=corner_squares, keras_model=keras_mlp_nudged_on_rank_one, schedule=Schedule(batch_size=32)
)
