"""Keras 3 models, whichever backend runs them (TensorFlow, or torch for a Keras model trained
under --framework torch): the neutral layer list as a Keras model, a recipe's own Keras model
checked, and the precision layers are made in (a Keras model's state, as both backends read
it, is `distributed/keras_state.py`'s).

Keras's own layouts (kernels (h, w, in, out) and (in, out), channels-last) are the neutral
layout, so a neutral model's weights are its variables by layer and name. A user's Keras model
is saved in the "keras" layout: its weights in `model.weights` order, named `<index>.<name>`
(`0003.kernel`), since Keras makes layer names unique per process (`conv2d_1`, ...) and a path
would change between two builds of the same model.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import keras

from hvd_train.builders import Built, Layout, model_type_error
from hvd_train.distributed.keras_state import POLICIES, weight_names
from hvd_train.errors import UsageError
from hvd_train.recipe import Recipe
from hvd_train.recipe.layers import Layer, Shape


@contextmanager
def precision(precision: str) -> Iterator[None]:
    """Keras layers made inside compute in `precision`."""
    before = keras.config.dtype_policy()
    keras.config.set_dtype_policy(POLICIES[precision])
    try:
        yield
    finally:
        keras.config.set_dtype_policy(before)


def seed(seed: int) -> None:
    keras.utils.set_random_seed(seed)


def own_model(recipe: Recipe, framework: str) -> Built:
    """The recipe's keras_model(), checked to be a Keras model on `framework`'s backend."""
    assert recipe.keras_model is not None
    model = recipe.keras_model()
    if not isinstance(model, keras.Model):
        raise model_type_error(recipe, "keras_model", "a Keras model", model)
    backend = keras.backend.backend()
    if backend != framework:
        raise UsageError(
            f"{recipe.source}: keras_model() built a model on Keras's {backend} backend, but "
            f"--framework {framework} needs the {framework} backend; run in a fresh process "
            f"(hvd_train sets KERAS_BACKEND before the recipe loads), or set "
            f"KERAS_BACKEND={framework} before importing keras"
        )
    return Built(model, Layout("keras"))


def build_neutral(layers: tuple[Layer, ...], input_shape: Shape) -> Built:
    """The neutral list as a Keras model, layer i named `layer<i>`; the final softmax is left
    to the loss (cross-entropy on logits is the numerically stable form). Its layout renames
    the weights from their index to their layer's name."""
    stack: list[Any] = [keras.Input(input_shape)]
    stack += [_layer(layer, f"layer{index}") for index, layer in enumerate(layers[:-1])]
    model = keras.Sequential(stack, name="model")
    names = dict(zip(weight_names(model), neutral_names(model), strict=True))
    layout = Layout(
        "neutral",
        to_saved=lambda weights: {names[name]: array for name, array in weights.items()},
        from_saved=lambda saved, current: {name: saved[names[name]] for name in current},
    )
    return Built(model, layout)


def _layer(layer: Layer, name: str) -> keras.layers.Layer:
    params = layer.params
    match layer.type:
        case "conv2d":
            return keras.layers.Conv2D(
                params["filters"], params["kernel_size"], strides=params["stride"],
                padding=params["padding"], name=name,
            )  # fmt: skip
        case "maxpool2d":
            return keras.layers.MaxPooling2D(params["pool_size"], name=name)
        case "avgpool2d":
            return keras.layers.AveragePooling2D(params["pool_size"], name=name)
        case "global_avgpool":
            return keras.layers.GlobalAveragePooling2D(name=name)
        case "batchnorm":
            return keras.layers.BatchNormalization(
                momentum=params["momentum"], epsilon=params["epsilon"], name=name
            )
        case "dropout":
            return keras.layers.Dropout(params["rate"], name=name)
        case "flatten":
            return keras.layers.Flatten(name=name)
        case "dense":
            return keras.layers.Dense(params["units"], name=name)
        case "relu":
            return keras.layers.ReLU(name=name)
    raise ValueError(f"no Keras layer for {layer.type!r}")


def neutral_names(model: keras.Model) -> list[str]:
    """The neutral names of a neutral model's weights: `layer<i>.<name>`."""
    return [f"{v.path.split('/')[-2]}.{v.name}" for v in model.weights]
