"""Recipes: what to train (data, model, loss) and how (optimizer, schedule, Horovod).

One `Recipe` type (`base.py`), made two ways: from a framework-neutral TOML file (`toml.py`),
whose model is a list of layers that both frameworks build, or in Python (`python.py`), whose
model comes from the user's own function for torch and/or Keras.
"""

from __future__ import annotations

import dataclasses
from importlib import resources

from hvd_train.recipe.base import Recipe
from hvd_train.recipe.examples import load_data, load_source, with_validation
from hvd_train.recipe.layers import Layer
from hvd_train.recipe.python import is_python_reference, load_python_recipe
from hvd_train.recipe.settings import (
    Checkpoints,
    Data,
    ExchangeSettings,
    Loading,
    Optimizer,
    Output,
    Schedule,
)
from hvd_train.recipe.toml import load_toml_recipe


def load_recipe(reference: str) -> Recipe:
    """A recipe by reference: a packaged name (`mnist_cnn`), a `.toml` file, a Python file
    (`path/recipe.py`, or `path/recipe.py:NAME` for another object than `recipe`), or a module
    (`package.module:NAME`)."""
    if is_python_reference(reference):
        return load_python_recipe(reference)
    if (resources.files("hvd_train.recipes") / f"{reference}.py").is_file():
        recipe = load_python_recipe(f"hvd_train.recipes.{reference}")
        return dataclasses.replace(recipe, name=reference)
    return load_toml_recipe(reference)


__all__ = [
    "Checkpoints",
    "Data",
    "ExchangeSettings",
    "Layer",
    "Loading",
    "Optimizer",
    "Output",
    "Recipe",
    "Schedule",
    "load_data",
    "load_recipe",
    "load_source",
    "with_validation",
]
