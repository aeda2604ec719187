"""Where a recipe's model comes from, and how checkpoints hold its weights.

A model is the neutral layer list built by the framework's builder (`torch_layers`,
`keras_models`: `builder`), or the recipe's own function for torch or Keras, checked by the
builder of its kind. Its `Layout` converts between
the weights as the backend gives them (the framework's own names and shapes) and as a checkpoint
keeps them: "neutral" (moves between frameworks), "torch" (a state_dict) or "keras" (Keras's
weights by index). Backends never see a recipe or a layout.
"""

from __future__ import annotations

import random
import sys
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np

from hvd_train.distributed import Layout
from hvd_train.errors import UsageError
from hvd_train.frameworks import FRAMEWORKS, OWN_MODELS
from hvd_train.recipe import Data, Recipe


@dataclass(frozen=True)
class Built:
    model: Any
    layout: Layout


def _torch_layers() -> ModuleType:
    from hvd_train.builders import torch_layers

    return torch_layers


def _keras_models() -> ModuleType:
    from hvd_train.builders import keras_models

    return keras_models


# By the registry's order of the kinds of a recipe's own models (`OWN_MODELS`): the builder of
# each, imported when asked for. Adding a framework adds a line here (docs/adding-a-framework.md).
BUILDERS = dict(zip(OWN_MODELS, (_torch_layers, _keras_models), strict=True))


def builder(kind: str) -> ModuleType:
    """The builder of models of `kind` (a layout of `OWN_MODELS`), imported now: it builds the
    neutral layer list for the framework whose models are of its kind (`build_neutral`), seeds
    its random numbers (`seed`) and checks a recipe's own model of its kind (`own_model`)."""
    return BUILDERS[kind]()


def framework_builder(framework: str) -> ModuleType:
    """The builder of the models `framework` makes from the neutral layer list."""
    return builder(FRAMEWORKS[framework].models[0])


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
            setting = getattr(builder(kind), "precision", None)
            if setting is not None:
                stack.enter_context(setting(precision))
        yield


def _build(recipe: Recipe, framework: str) -> Built:
    """The neutral list by the framework's builder; the recipe's own model by the builder of
    its kind (a Keras model under torch: Keras's)."""
    layout = recipe.layout(framework)
    if layout == "neutral":
        assert isinstance(recipe.data, Data) and recipe.data.input_shape is not None
        built: Built = framework_builder(framework).build_neutral(
            recipe.layers, recipe.data.input_shape
        )
        return built
    own: Built = builder(layout).own_model(recipe, framework)
    return own


def seed_framework(framework: str, seed: int) -> None:
    """Seeds the random numbers a model's initialisers draw from: Python's (Keras draws its
    initialisers' seeds there), NumPy's, and the framework's (its builder's `seed`)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    framework_builder(framework).seed(seed)


def model_type_error(recipe: Recipe, builder: str, expected: str, model: Any) -> UsageError:
    return UsageError(
        f"{recipe.source}: {builder}() returned {type(model).__name__}, not {expected}; "
        f"return the model from {builder}"
    )
