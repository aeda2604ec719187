"""hvd_train: Horovod data-parallel training from one recipe, under PyTorch or TensorFlow.

In a Python recipe or a notebook:

    from hvd_train import Data, Recipe, Schedule, launch
    recipe = Recipe(data=Data("mnist"), torch_model=my_model, schedule=Schedule(epochs=2))
    summary = launch(recipe, np=2)
"""

from hvd_train.api import train
from hvd_train.callbacks import Callback, State
from hvd_train.launching import launch
from hvd_train.recipe import (
    Checkpoints,
    Data,
    Horovod,
    Loading,
    Optimizer,
    Output,
    Recipe,
    Schedule,
)
from hvd_train.recipe.layers import Layer
from hvd_train.version import __version__

__all__ = [
    "Callback",
    "Checkpoints",
    "Data",
    "Horovod",
    "Layer",
    "Loading",
    "Optimizer",
    "Output",
    "Recipe",
    "Schedule",
    "State",
    "__version__",
    "launch",
    "train",
]
