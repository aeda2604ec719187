"""A Keras 3 model's state as the backends that run one read and write it (TensorFlow's, and
torch's for a Keras model trained under --framework torch): its weights by index (the "keras"
layout), which of them are trained, the names it takes its inputs by, the seed states of its
random layers, and the dtype policy of each precision.

A Keras model's weights are saved in `model.weights` order, named `<index>.<name>`
(`0003.kernel`), since Keras makes layer names unique per process (`conv2d_1`, ...) and a path
would change between two builds of the same model.
"""

from __future__ import annotations

from typing import Any

import keras
import numpy as np

SEED_STATE = "seed_generator_state"


# Keras's dtype policies for the recipe's precisions: compute in bf16 or fp16, weights in fp32.
POLICIES = {"fp32": "float32", "bf16-mixed": "mixed_bfloat16", "fp16-mixed": "mixed_float16"}


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


def weight_names(model: keras.Model) -> list[str]:
    """The names of `model.weights`, in order: `<index>.<name>`, the "keras" layout's."""
    return [f"{index:04d}.{v.name}" for index, v in enumerate(model.weights)]


def trained_names(model: keras.Model) -> tuple[str, ...]:
    """The names (`weight_names`) of the weights the optimizer trains."""
    trained = {id(v) for v in model.trainable_weights}
    return tuple(n for n, v in zip(weight_names(model), model.weights, strict=True)
                 if id(v) in trained)  # fmt: skip


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


def seed_state(seed: int, index: int, dtype: Any) -> np.ndarray:
    """The seed state of a model's `index`-th random layer for a step's `seed` (of any size):
    folded into the state's dtype as Keras folds its own seeds, by their low 32 bits (uint32,
    or int32 under torch, whose random ops read the bits as uint32 again), the same on every
    rank and on resume."""
    return np.array([seed, index], dtype=np.uint64).astype(np.uint32).astype(dtype)


def seed_states(model: keras.Model) -> list[Any]:
    """The state variables of the model's random layers (dropout, ...), nested ones included."""
    return [v for v in model.variables if v.path.endswith(SEED_STATE)]
