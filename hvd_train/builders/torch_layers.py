"""The neutral layer list as torch modules, and their weights in the neutral layout.

Module i of the `nn.Sequential` is layer i of the list (the final softmax is left to the loss),
so `3.weight` is layer 3's weight. torch's own layouts differ from the neutral one in three
places, each converted here: conv kernels (out, in, h, w), dense kernels (out, in), and the
names of batchnorm's tensors. Flatten permutes to channels-last, so dense kernels need only a
transpose.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from hvd_train.builders import Built, Layout, model_type_error
from hvd_train.distributed import Arrays
from hvd_train.recipe import Recipe
from hvd_train.recipe.layers import Layer, Shape, input_shapes, same_padding

# torch's name of a tensor -> the neutral name, by layer type.
NEUTRAL_NAMES = {
    "conv2d": {"weight": "kernel", "bias": "bias"},
    "dense": {"weight": "kernel", "bias": "bias"},
    "batchnorm": {
        "weight": "gamma",
        "bias": "beta",
        "running_mean": "moving_mean",
        "running_var": "moving_variance",
    },
}


class ChannelsLastFlatten(nn.Module):
    """Flattens (N, C, H, W) in (H, W, C) order, the neutral order."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x.permute(0, 2, 3, 1) if x.dim() == 4 else x).flatten(1)


class GlobalAvgPool(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.mean(dim=(2, 3))


class SamePaddedConv2d(nn.Conv2d):
    """A convolution with TensorFlow's "same" padding, which torch's own `padding="same"`
    offers neither for strides above 1 nor with the extra row at the end."""

    def __init__(self, shape: Shape, filters: int, kernel: int, stride: int) -> None:
        super().__init__(shape[2], filters, kernel, stride)
        top, bottom = same_padding(shape[0], kernel, stride)
        left, right = same_padding(shape[1], kernel, stride)
        self.pads = (left, right, top, bottom)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(F.pad(x, self.pads))


def _module(layer: Layer, shape: Shape) -> nn.Module:
    params = layer.params
    match layer.type:
        case "conv2d":
            filters, kernel, stride = params["filters"], params["kernel_size"], params["stride"]
            if params["padding"] == "same":
                return SamePaddedConv2d(shape, filters, kernel, stride)
            return nn.Conv2d(shape[2], filters, kernel, stride)
        case "maxpool2d":
            return nn.MaxPool2d(params["pool_size"])
        case "avgpool2d":
            return nn.AvgPool2d(params["pool_size"])
        case "global_avgpool":
            return GlobalAvgPool()
        case "batchnorm":
            norm = nn.BatchNorm2d if len(shape) == 3 else nn.BatchNorm1d
            # torch's momentum is the weight of the new batch, Keras's that of the old average.
            return norm(shape[-1], eps=params["epsilon"], momentum=1.0 - params["momentum"])
        case "flatten":
            return ChannelsLastFlatten()
        case "dense":
            return nn.Linear(shape[0], params["units"])
        case "dropout":
            return nn.Dropout(params["rate"])
        case "relu":
            return nn.ReLU()
    raise ValueError(f"no torch module for {layer.type!r}")


def seed(seed: int) -> None:
    torch.manual_seed(seed)  # (keras.utils.set_random_seed would import TensorFlow too)


def own_model(recipe: Recipe, framework: str) -> Built:
    """The recipe's torch_model(), checked to be a torch module."""
    assert recipe.torch_model is not None
    model = recipe.torch_model()
    if not isinstance(model, nn.Module):
        raise model_type_error(recipe, "torch_model", "a torch.nn.Module", model)
    return Built(model, Layout("torch"))


def build_neutral(layers: tuple[Layer, ...], input_shape: Shape) -> Built:
    """The neutral list as an `nn.Sequential`, with the layout that converts its state_dict."""
    shapes = input_shapes(layers, input_shape)
    modules = {str(i): _module(layer, shapes[i]) for i, layer in enumerate(layers[:-1])}
    layout = Layout(
        "neutral",
        to_saved=lambda state: to_neutral(layers, state),
        from_saved=lambda saved, current: from_neutral(layers, saved, current),
    )
    return Built(nn.Sequential(OrderedDict(modules)), layout)


def to_neutral(layers: tuple[Layer, ...], state: Arrays) -> Arrays:
    """A state_dict of `build_neutral`'s model in the neutral layout (batchnorm's step counter,
    which Keras does not keep, is left out)."""
    arrays = {}
    for name, array in state.items():
        index, kind = name.split(".")
        neutral = NEUTRAL_NAMES[layers[int(index)].type].get(kind)
        if neutral is None:
            continue
        if neutral == "kernel":
            array = array.transpose(2, 3, 1, 0) if array.ndim == 4 else array.T
        arrays[f"layer{index}.{neutral}"] = np.ascontiguousarray(array)
    return arrays


def from_neutral(layers: tuple[Layer, ...], arrays: Arrays, current: Arrays) -> Arrays:
    """The inverse of `to_neutral`: a full state_dict, taking what the neutral layout lacks
    (batchnorm's step counter) from `current`."""
    state = {}
    for name, array in current.items():
        index, kind = name.split(".")
        neutral = NEUTRAL_NAMES[layers[int(index)].type].get(kind)
        if neutral is not None:
            array = arrays[f"layer{index}.{neutral}"]
            if neutral == "kernel":
                array = array.transpose(3, 2, 0, 1) if array.ndim == 4 else array.T
        state[name] = np.ascontiguousarray(array)
    return state
