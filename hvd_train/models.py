"""Where a recipe's model comes from: the neutral layer list, built by the chosen framework's
builder, or the recipe's own function for torch or Keras."""

from __future__ import annotations

import sys
from typing import Any

from hvd_train.adapters import Adapter
from hvd_train.errors import UsageError
from hvd_train.recipe import Data, Recipe


def build_model(recipe: Recipe, adapter: Adapter, seed: int) -> Any:
    """The recipe's model under `adapter`'s framework, built after seeding the framework, so
    every build in a run (and in its resumed run) starts from the same weights."""
    recipe.check_framework(adapter.name)
    adapter.seed(seed)
    layout = recipe.layout(adapter.name)
    if layout == "neutral":
        assert isinstance(recipe.data, Data) and recipe.data.input_shape is not None
        return adapter.build_layers(recipe.layers, recipe.data.input_shape)
    if layout == "torch":
        assert recipe.torch_model is not None
        return recipe.torch_model()
    assert recipe.keras_model is not None
    model = recipe.keras_model()
    backend = sys.modules["keras"].backend.backend() if "keras" in sys.modules else None
    if backend != adapter.name:
        raise UsageError(
            f"{recipe.source}: keras_model() built a model on Keras's {backend} backend, but "
            f"--framework {adapter.name} needs the {adapter.name} backend; run in a fresh process "
            f"(hvd_train sets KERAS_BACKEND before the recipe loads), or set "
            f"KERAS_BACKEND={adapter.name} before importing keras"
        )
    return model
