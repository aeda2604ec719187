"""A NumPy forward pass over framework-neutral weights: the layout's executable definition."""

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from hvd_train.recipe import Recipe


def reference_logits(
    recipe: Recipe, weights: dict[str, np.ndarray], images: np.ndarray
) -> np.ndarray:
    x = images.astype(np.float64)  # (N, H, W, C)
    for index, layer in enumerate(recipe.layers[:-1]):
        kernel, bias = weights.get(f"layer{index}.kernel"), weights.get(f"layer{index}.bias")
        if layer.type == "conv2d":  # kernel (kh, kw, in, out)
            windows = sliding_window_view(
                x, kernel.shape[:2], axis=(1, 2)
            )  # (N, H', W', C, kh, kw)
            x = np.einsum("nhwcij,ijco->nhwo", windows, kernel) + bias
        elif layer.type == "maxpool2d":
            p = layer.params["pool_size"]
            n, h, w, c = x.shape
            x = (
                x[:, : h // p * p, : w // p * p]
                .reshape(n, h // p, p, w // p, p, c)
                .max(axis=(2, 4))
            )
        elif layer.type == "relu":
            x = np.maximum(x, 0)
        elif layer.type == "flatten":  # channels-last order
            x = x.reshape(len(x), -1)
        elif layer.type == "dense":  # kernel (in, out)
            x = x @ kernel + bias
    return x
