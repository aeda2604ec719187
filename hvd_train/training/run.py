"""The start of every run (training, eval, bench, the benchmarks and the tests): the distributed
layer with Horovod started, then the recipe's model built and set up on it."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from hvd_train.builders import build_model
from hvd_train.distributed import Distributed, Layout, buckets
from hvd_train.recipe import Recipe
from hvd_train.recipe.layers import trained_weight_shapes
from hvd_train.recipe.settings import Data, Optimizer


def start(framework: str, recipe: Recipe | None = None) -> Distributed:
    """The distributed layer under `framework`, with Horovod started and this process pinned
    to its device; `recipe`, where it is known this early, tells whether its step may overlap
    the exchange."""
    return Distributed(framework, may_overlap=recipe is None or may_overlap(recipe))


def may_overlap(recipe: Recipe) -> bool:
    """Whether `recipe`'s gradients may travel while the backward pass goes on: not with
    overlap off, nor where a neutral model's gradients fill one bucket (which goes after the
    pass either way). A Python recipe's model is known only once it is built: it may."""
    if recipe.horovod.overlap is False:
        return False
    if not recipe.layers:
        return True
    assert isinstance(recipe.data, Data) and recipe.data.input_shape  # checked with the layers
    shapes = trained_weight_shapes(recipe.layers, recipe.data.input_shape)
    sizes = [4 * math.prod(shape) for shape in shapes.values()]  # fp32 gradients
    return len(buckets(sizes)) > 1


@dataclass(frozen=True)
class Run:
    """A recipe's model, set up on a started layer, and how checkpoints hold its weights."""

    dist: Distributed
    recipe: Recipe
    layout: Layout
    model: Any  # the framework's own: a torch module, a Keras model

    def weights(self) -> dict[str, np.ndarray]:
        """The model's weights as checkpoints hold them."""
        return self.layout.to_saved(self.dist.exchange.state(optimizer=False).weights)


def open_run(framework: str | Distributed, recipe: Recipe, seed: int, trains: bool = True) -> Run:
    """`recipe`'s model, built from `seed`, set up on `framework`'s layer (started here, or
    already started when the recipe had to be read with its collectives); sharded as the
    recipe says where it `trains` (evaluating and exporting step nothing)."""
    dist = start(framework, recipe) if isinstance(framework, str) else framework
    built = build_model(recipe, dist.framework, seed)
    optimizer = recipe.optimizer
    assert isinstance(optimizer, Optimizer)  # a function given is one's `function`
    settings = recipe.horovod if trains else recipe.horovod.unsharded()
    model, _ = dist.setup(
        built.model, optimizer, horovod=settings, gradient_clip_norm=optimizer.gradient_clip_norm,
        precision=recipe.schedule.precision, loss=recipe.loss, layout=built.layout,
    )  # fmt: skip
    return Run(dist, recipe, built.layout, model)
