"""Keras 3 models, whichever backend runs them (TensorFlow, or torch for a Keras model trained
under --framework torch): the neutral layer list as a Keras model, its weights by index and
by layer name, and per-step dropout seeds.

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
import numpy as np

from hvd_train.builders import Built, Layout, model_type_error
from hvd_train.errors import UsageError
from hvd_train.recipe import Recipe
from hvd_train.recipe.layers import Layer, Shape

SEED_STATE = "seed_generator_state"


# Keras's dtype policies for the recipe's precisions: compute in bf16 or fp16, weights in fp32.
POLICIES = {"fp32": "float32", "bf16-mixed": "mixed_bfloat16", "fp16-mixed": "mixed_float16"}


@contextmanager
def precision(precision: str) -> Iterator[None]:
    """Keras layers made inside compute in `precision`."""
    before = keras.config.dtype_policy()
    keras.config.set_dtype_policy(POLICIES[precision])
    try:
        yield
    finally:
        keras.config.set_dtype_policy(before)


def input_names(model: keras.Model) -> tuple[str, ...] | None:
    """The names a functional model takes its inputs by (its dict's keys, or its `Input`s'
    names), none for a Sequential (one unnamed input), or None where it does not say (a
    subclassed model)."""
    if isinstance(model, keras.Sequential):
        return ()
    structure = getattr(model, "_inputs_struct", None)
    if isinstance(structure, dict):
        return tuple(structure)
    inputs = getattr(model, "inputs", None) if structure is not None else None
    return tuple(tensor.name for tensor in inputs) if inputs else None


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


def weight_names(model: keras.Model) -> list[str]:
    """The names of `model.weights`, in order: `<index>.<name>`, the "keras" layout's."""
    return [f"{index:04d}.{v.name}" for index, v in enumerate(model.weights)]


def trained_names(model: keras.Model) -> tuple[str, ...]:
    """The names (`weight_names`) of the weights the optimizer trains."""
    trained = {id(v) for v in model.trainable_weights}
    return tuple(n for n, v in zip(weight_names(model), model.weights, strict=True)
                 if id(v) in trained)  # fmt: skip


def neutral_names(model: keras.Model) -> list[str]:
    """The neutral names of a neutral model's weights: `layer<i>.<name>`."""
    return [f"{v.path.split('/')[-2]}.{v.name}" for v in model.weights]


def layer_types(model: keras.Model) -> list[str]:
    """The type of the innermost listed layer holding each trainable variable, in the order of
    `model.trainable_variables`."""
    holder: dict[int, str] = {}

    def visit(layer: keras.layers.Layer) -> None:
        holder.update({id(v): type(layer).__name__ for v in layer.trainable_variables})
        for inner in getattr(layer, "layers", []):
            visit(inner)

    visit(model)
    return [holder[id(v)] for v in model.trainable_variables]


def weights(model: keras.Model) -> dict[str, np.ndarray]:
    return {
        n: np.asarray(keras.ops.convert_to_numpy(v))
        for n, v in zip(weight_names(model), model.weights, strict=True)
    }


def load_weights(model: keras.Model, arrays: dict[str, np.ndarray]) -> None:
    """Assigns every weight; the names must be exactly the model's (checked by the caller)."""
    names = weight_names(model)
    if set(names) != set(arrays):
        raise ValueError(f"weights {sorted(set(names) ^ set(arrays))} do not match the model")
    for name, variable in zip(names, model.weights, strict=True):
        variable.assign(arrays[name])


def seed_states(model: keras.Model) -> list[Any]:
    """The state variables of the model's random layers (dropout, ...), nested ones included."""
    return [v for v in model.variables if v.path.endswith(SEED_STATE)]
