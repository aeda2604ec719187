"""A NumPy forward pass over framework-neutral weights: the layout's executable definition."""

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from hvd_train.recipe.layers import Layer, same_padding


def _conv(x: np.ndarray, kernel: np.ndarray, bias: np.ndarray, params: dict) -> np.ndarray:
    k, stride = params["kernel_size"], params["stride"]
    if params["padding"] == "same":
        rows, cols = same_padding(x.shape[1], k, stride), same_padding(x.shape[2], k, stride)
        x = np.pad(x, ((0, 0), rows, cols, (0, 0)))
    windows = sliding_window_view(x, (k, k), axis=(1, 2))[:, ::stride, ::stride]
    return np.einsum("nhwcij,ijco->nhwo", windows, kernel) + bias  # kernel (kh, kw, in, out)


def _pool(x: np.ndarray, p: int, reduce) -> np.ndarray:
    n, h, w, c = x.shape
    return reduce(x[:, : h // p * p, : w // p * p].reshape(n, h // p, p, w // p, p, c), (2, 4))


def reference_logits(
    layers: tuple[Layer, ...], weights: dict[str, np.ndarray], images: np.ndarray
) -> np.ndarray:
    x = images.astype(np.float64)  # (N, H, W, C)
    for index, layer in enumerate(layers[:-1]):
        w = {k.split(".", 1)[1]: v for k, v in weights.items() if k.startswith(f"layer{index}.")}
        if layer.type == "conv2d":
            x = _conv(x, w["kernel"], w["bias"], layer.params)
        elif layer.type == "maxpool2d":
            x = _pool(x, layer.params["pool_size"], lambda a, axes: a.max(axis=axes))
        elif layer.type == "avgpool2d":
            x = _pool(x, layer.params["pool_size"], lambda a, axes: a.mean(axis=axes))
        elif layer.type == "global_avgpool":
            x = x.mean(axis=(1, 2))
        elif layer.type == "batchnorm":  # inference: the running statistics
            scale = w["gamma"] / np.sqrt(w["moving_variance"] + layer.params["epsilon"])
            x = (x - w["moving_mean"]) * scale + w["beta"]
        elif layer.type == "relu":
            x = np.maximum(x, 0)
        elif layer.type == "flatten":  # channels-last order
            x = x.reshape(len(x), -1)
        elif layer.type == "dense":  # kernel (in, out)
            x = x @ w["kernel"] + w["bias"]
    return x
