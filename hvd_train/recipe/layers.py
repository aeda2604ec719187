"""The framework-neutral layer list: layer types, their parameters, and the one place where
output shapes and weight shapes are worked out. The recipe checks a model with it, and the
torch and Keras builders size their layers with it, so all three agree by construction.

A shape is (height, width, channels) for an image and (features,) once flat. Weights are named
`layer<i>.<weight>` (i: the layer's index in the list) in one layout, Keras's: conv kernels
(height, width, in, out), dense kernels (in, out), flatten in channels-last order, batchnorm
`gamma`, `beta`, `moving_mean`, `moving_variance`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from hvd_train.errors import UsageError
from hvd_train.recipe.rules import Rule

Shape = tuple[int, ...]

# Each layer type's parameters: name -> (rule, default or None when required).
PARAMETERS: dict[str, dict[str, tuple[Rule, Any]]] = {
    "conv2d": {
        "filters": (Rule(int, minimum=1), None),
        "kernel_size": (Rule(int, minimum=1), None),
        "stride": (Rule(int, minimum=1), 1),
        "padding": (Rule(str, choices=("valid", "same")), "valid"),
    },
    "maxpool2d": {"pool_size": (Rule(int, minimum=1), None)},
    "avgpool2d": {"pool_size": (Rule(int, minimum=1), None)},
    "global_avgpool": {},
    "batchnorm": {
        # Keras's meaning: the share of the running statistics kept at each step.
        "momentum": (Rule(float, minimum=0.0, below=1.0), 0.9),
        "epsilon": (Rule(float, positive=True), 1e-5),
    },
    "dropout": {"rate": (Rule(float, minimum=0.0, below=1.0), None)},
    "flatten": {},
    "dense": {"units": (Rule(int, minimum=1), None)},
    "relu": {},
    "softmax": {},
}
IMAGE_ONLY = ("conv2d", "maxpool2d", "avgpool2d", "global_avgpool")
RUNNING = (".moving_mean", ".moving_variance")  # batchnorm's statistics, not trained


@dataclass(frozen=True)
class Layer:
    """One entry of the list: `Layer("conv2d", {"filters": 32, "kernel_size": 5})`."""

    type: str
    params: dict[str, Any] = field(default_factory=dict)


def same_padding(size: int, kernel: int, stride: int) -> tuple[int, int]:
    """Padding before and after one spatial axis for "same" (TensorFlow's rule: the output is
    ceil(size / stride) long, and an odd total puts the extra row or column at the end)."""
    total = max((math.ceil(size / stride) - 1) * stride + kernel - size, 0)
    return total // 2, total - total // 2


def output_shape(layer: Layer, shape: Shape) -> Shape:
    """The shape `layer` makes of an input of `shape`."""
    params = layer.params
    if layer.type == "conv2d":
        k, s = params["kernel_size"], params["stride"]
        if params["padding"] == "same":
            height, width = math.ceil(shape[0] / s), math.ceil(shape[1] / s)
        else:
            height, width = (shape[0] - k) // s + 1, (shape[1] - k) // s + 1
        return height, width, params["filters"]
    if layer.type in ("maxpool2d", "avgpool2d"):
        p = params["pool_size"]
        return shape[0] // p, shape[1] // p, shape[2]
    if layer.type == "global_avgpool":
        return (shape[2],)
    if layer.type == "flatten":
        return (math.prod(shape),)
    if layer.type == "dense":
        return (params["units"],)
    return shape


def weight_shapes(layer: Layer, shape: Shape) -> dict[str, Shape]:
    """The neutral shapes of `layer`'s weights for an input of `shape`, by weight name."""
    if layer.type == "conv2d":
        k, filters = layer.params["kernel_size"], layer.params["filters"]
        return {"kernel": (k, k, shape[2], filters), "bias": (filters,)}
    if layer.type == "dense":
        return {"kernel": (shape[0], layer.params["units"]), "bias": (layer.params["units"],)}
    if layer.type == "batchnorm":
        return {name: (shape[-1],) for name in ("gamma", "beta", "moving_mean", "moving_variance")}
    return {}


def neutral_weight_shapes(layers: tuple[Layer, ...], input_shape: Shape) -> dict[str, Shape]:
    """Every weight of the model, `layer<i>.<name>` -> shape, in layer order."""
    shapes: dict[str, Shape] = {}
    shape = input_shape
    for index, layer in enumerate(layers):
        shapes |= {f"layer{index}.{n}": s for n, s in weight_shapes(layer, shape).items()}
        shape = output_shape(layer, shape)
    return shapes


def trained_weight_shapes(layers: tuple[Layer, ...], input_shape: Shape) -> dict[str, Shape]:
    """The weights training changes, in layer order (batchnorm's running statistics are not
    trained)."""
    shapes = neutral_weight_shapes(layers, input_shape)
    return {name: shape for name, shape in shapes.items() if not name.endswith(RUNNING)}


def trainable_parameter_count(layers: tuple[Layer, ...], input_shape: Shape) -> int:
    """The number of trained numbers."""
    return sum(map(math.prod, trained_weight_shapes(layers, input_shape).values()))


def input_shapes(layers: tuple[Layer, ...], input_shape: Shape) -> list[Shape]:
    """The shape entering each layer."""
    shapes = [input_shape]
    for layer in layers[:-1]:
        shapes.append(output_shape(layer, shapes[-1]))
    return shapes


def checked_layer(raw: Any, where: str) -> Layer:
    """A layer from a TOML table or a Python `Layer`, its parameters checked and defaulted."""
    if isinstance(raw, Layer):
        raw = {"type": raw.type, **raw.params}
    if not isinstance(raw, dict):
        raise UsageError(f'{where}: expected a table like {{ type = "relu" }}')
    kind = Rule(str, choices=tuple(PARAMETERS)).check(f"{where}.type", raw.get("type", ""))
    params = {}
    for name, (rule, default) in PARAMETERS[kind].items():
        if name not in raw and default is None:
            raise UsageError(f"{where}.{name}: missing; add it to the layer")
        params[name] = rule.check(f"{where}.{name}", raw.get(name, default))
    unknown = sorted(set(raw) - set(params) - {"type"})
    if unknown:
        raise UsageError(
            f"{where}.{unknown[0]}: unknown key; check its spelling against the "
            "recipe reference (docs/recipes.md)"
        )
    return Layer(kind, params)


def checked_layers(raw: Any, input_shape: Shape, num_classes: int) -> tuple[Layer, ...]:
    """The whole list, checked: each layer fits its input, and the list ends with a dense layer
    of `num_classes` units and softmax (the loss takes the logits before it)."""
    if not isinstance(raw, list | tuple) or not raw:
        raise UsageError("model.layers: expected a non-empty list of layers")
    layers = tuple(checked_layer(item, f"model.layers[{i}]") for i, item in enumerate(raw))
    if layers[-1].type != "softmax":
        raise UsageError("model.layers: must end with a softmax layer (cross_entropy needs it)")
    if any(layer.type == "softmax" for layer in layers[:-1]):
        raise UsageError("model.layers: softmax may only be the last layer")
    shape: Shape = input_shape
    for index, layer in enumerate(layers):
        where = f"model.layers[{index}]"
        if layer.type in IMAGE_ONLY and len(shape) != 3:
            raise UsageError(f"{where}: {layer.type} needs an image, but its input is flat")
        if layer.type == "dense" and len(shape) != 1:
            raise UsageError(f"{where}: dense needs a flat input; add a flatten layer before it")
        shape = output_shape(layer, shape)
        if min(shape) < 1:
            raise UsageError(f"{where}: {layer.type} does not fit its input; make it smaller")
    if layers[-2].type != "dense" or layers[-2].params["units"] != num_classes:
        raise UsageError(
            f"model.layers: must end with a dense layer of {num_classes} units (the number of "
            "classes) and softmax"
        )
    return layers
