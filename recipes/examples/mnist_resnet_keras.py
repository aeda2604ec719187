"""The same small residual network in Keras 3: a Python recipe for both frameworks.

    horovodrun -np 2 python -m hvd_train --recipe recipes/examples/mnist_resnet_keras.py \
        --framework tensorflow          # or --framework torch

Under --framework torch, hvd_train sets KERAS_BACKEND=torch before this file loads, so the
model is built from torch modules and trained with Horovod's torch optimizer: one model,
written once, under either framework, its dropout drawing each step's numbers from the step's
seed under both. Keras models take images as (N, H, W, C).
"""

import keras

from hvd_train import Data, Optimizer, Recipe, Schedule


def residual_block(x, channels: int):
    y = keras.layers.Conv2D(channels, 3, padding="same", use_bias=False)(x)
    y = keras.layers.BatchNormalization(momentum=0.9, epsilon=1e-5)(y)
    y = keras.layers.ReLU()(y)
    y = keras.layers.Conv2D(channels, 3, padding="same", use_bias=False)(y)
    y = keras.layers.BatchNormalization(momentum=0.9, epsilon=1e-5)(y)
    return keras.layers.ReLU()(keras.layers.Add()([x, y]))


def resnet() -> keras.Model:
    """28x28 -> 14x14 (16 channels) -> 7x7 (32 channels) -> dropout -> 10 logits."""
    inputs = keras.Input((28, 28, 1))
    x = keras.layers.Conv2D(16, 3, padding="same", use_bias=False)(inputs)
    x = keras.layers.BatchNormalization(momentum=0.9, epsilon=1e-5)(x)
    x = keras.layers.MaxPooling2D(2)(keras.layers.ReLU()(x))
    x = residual_block(x, 16)
    x = keras.layers.Conv2D(32, 3, strides=2, padding="same", use_bias=False)(x)
    x = keras.layers.BatchNormalization(momentum=0.9, epsilon=1e-5)(x)
    x = residual_block(keras.layers.ReLU()(x), 32)
    x = keras.layers.Dropout(0.1)(keras.layers.GlobalAveragePooling2D()(x))
    return keras.Model(inputs, keras.layers.Dense(10)(x), name="resnet")


recipe = Recipe(
    data=Data("mnist"),
    keras_model=resnet,
    optimizer=Optimizer(name="adamw", learning_rate=0.002, weight_decay=0.0001),
    schedule=Schedule(epochs=1, batch_size=64, warmup_epochs=0.1, decay="cosine"),
)
