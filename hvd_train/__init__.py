"""hvd_train: Horovod data-parallel training from one recipe, under PyTorch or TensorFlow,
or in a loop of one's own.

In a Python recipe or a notebook:

    from hvd_train import Data, Recipe, Schedule, launch
    recipe = Recipe(data=Data("mnist"), torch_model=my_model, schedule=Schedule(epochs=2))
    summary = launch(recipe, np=2)

In a loop of one's own, `Distributed` (`hvd_train.distributed`) gives it Horovod's steps:

    dist = Distributed("torch")
    model, optimizer = dist.setup(model, optimizer)
"""

from hvd_train.api import train
from hvd_train.callbacks import Callback, State
from hvd_train.distributed import Distributed
from hvd_train.launching import launch
from hvd_train.recipe import (
    Checkpoints,
    Data,
    ExchangeSettings,
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
    "Distributed",
    "ExchangeSettings",
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
