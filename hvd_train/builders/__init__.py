"""Where a recipe's model comes from, and how checkpoints hold its weights.

A model is the neutral layer list built by the framework's builder (`torch_layers`,
`keras_models`, named in `hvd_train/distributed/frameworks.py`), or the recipe's own function
for torch or Keras, checked by the builder of its kind. Its `Layout` converts between
the weights as the backend gives them (the framework's own names and shapes) and as a checkpoint
keeps them: "neutral" (moves between frameworks), "torch" (a state_dict) or "keras" (Keras's
weights by index). Backends never see a recipe or a layout.
"""

from __future__ import annotations

import importlib
import random
import sys
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np

from hvd_train.checkpoint import Arrays
from hvd_train.distributed.frameworks import OWN_MODELS, builder_of, framework_named
from hvd_train.errors import UsageError
from hvd_train.recipe import Data, Recipe


def _as_saved(weights: Arrays) -> Arrays:
    return weights


def _as_given(saved: Arrays, current: Arrays) -> Arrays:
    return saved


@dataclass(frozen=True)
class Layout:
    """How a checkpoint holds a model's weights: `name`, recorded in the checkpoint, and the
    conversion from the backend's weights (`to_saved`) and back (`from_saved`, which takes
    what the saved layout lacks from the model's current weights)."""

    name: str
    to_saved: Callable[[Arrays], Arrays] = _as_saved
    from_saved: Callable[[Arrays, Arrays], Arrays] = _as_given


@dataclass(frozen=True)
class Built:
    model: Any
    layout: Layout


def build_model(recipe: Recipe, framework: str, seed: int) -> Built:
    """The recipe's model under `framework`, built after seeding the framework, so every build
    in a run (and in its resumed run) starts from the same weights. Keras layers are made under
    the policy of the recipe's precision (`models_precision`); a torch module computes in it
    under torch.autocast (`distributed.torch.modules.compute_in`)."""
    recipe.check_framework(framework)
    seed_framework(framework, seed)
    with models_precision(recipe.schedule.precision):
        return _build(recipe, framework)


@contextmanager
def models_precision(precision: str) -> Iterator[None]:
    """Models of each kind whose library is loaded (a Keras model under torch too) are made
    inside computing in `precision`, where their builder sets it so (its `precision`)."""
    with ExitStack() as stack:
        for kind in [kind for kind in OWN_MODELS if kind in sys.modules]:  # (modules' names)
            setting = getattr(importlib.import_module(builder_of(kind)), "precision", None)
            if setting is not None:
                stack.enter_context(setting(precision))
        yield


def _build(recipe: Recipe, framework: str) -> Built:
    """The neutral list by the framework's builder; the recipe's own model by the builder of
    its kind (a Keras model under torch: Keras's)."""
    layout = recipe.layout(framework)
    if layout == "neutral":
        assert isinstance(recipe.data, Data) and recipe.data.input_shape is not None
        builder = importlib.import_module(framework_named(framework).builder)
        built: Built = builder.build_neutral(recipe.layers, recipe.data.input_shape)
        return built
    own: Built = importlib.import_module(builder_of(layout)).own_model(recipe, framework)
    return own


def seed_framework(framework: str, seed: int) -> None:
    """Seeds the random numbers a model's initialisers draw from: Python's (Keras draws its
    initialisers' seeds there), NumPy's, and the framework's (its builder's `seed`)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    importlib.import_module(framework_named(framework).builder).seed(seed)


def model_type_error(recipe: Recipe, builder: str, expected: str, model: Any) -> UsageError:
    return UsageError(
        f"{recipe.source}: {builder}() returned {type(model).__name__}, not {expected}; "
        f"return the model from {builder}"
    )
