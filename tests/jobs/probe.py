"""Runs one framework's backend in its own process (so pytest never loads a Horovod binding)
and saves what the layout tests compare.

usage: probe.py FRAMEWORK DATA_DIR RECIPE WEIGHTS.safetensors OUT.npz [RECIPE WEIGHTS OUT ...]
For each recipe in turn, on a layer of its own (the framework's start paid once), saves
`weights.<name>` after loading WEIGHTS, `logits` for the first 32 test examples, the
framework's own count of trained numbers, `stepped.<name>` after a step at learning rate 0,
and `optimizer.<name>` before and `restored.<name>` after an optimizer-state round trip (two
parameter groups).
"""

import sys
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file

from hvd_train.data import take
from hvd_train.recipe import load_data, load_recipe
from hvd_train.training.run import open_run


def probe(framework: str, reference: str, data_dir: str, weights_path: str, out: str) -> None:
    recipe = load_recipe(reference)
    data = load_data(recipe, Path(data_dir))
    run = open_run(framework, recipe, seed=0)
    dist = run.dist
    current = dist.exchange.state().weights
    dist.exchange.load_state(weights=run.layout.from_saved(load_file(weights_path), current))
    saved = {f"weights.{name}": array for name, array in run.weights().items()}
    images, _ = take(data.test, np.arange(32))
    saved["logits"] = dist.exchange.eval_batch(images)[1]
    if framework == "torch":
        trained = sum(p.numel() for _, p in dist.environment.backend.net.trainable())
    else:
        trained = sum(int(np.prod(v.shape)) for v in dist.exchange.model.trainable_weights)
    saved["trained_parameters"] = np.array(trained)

    # One step at learning rate 0 moves only batchnorm's running statistics.
    dist.exchange.step([take(data.train, np.arange(64))], 0.0, 0, np.zeros(2))
    saved |= {f"stepped.{name}": array for name, array in run.weights().items()}

    # The biases in a parameter group of their own: the state keeps the parameters' order.
    grouped = recipe.with_overrides({"weight_decay": 1e-4, "weight_decay_exclude": ["bias"]})
    dist = open_run(framework, grouped, seed=0).dist
    for step in range(2):  # give the optimizer some state
        batch = take(data.train, np.arange(64 * step, 64 * (step + 1)))
        dist.exchange.step([batch], 0.001, step, np.zeros(2))
    state = dist.exchange.state().optimizer
    fresh = open_run(framework, grouped, seed=1).dist
    fresh.exchange.load_state(optimizer=state)
    saved |= {f"optimizer.{name}": array for name, array in state.items()}
    saved |= {f"restored.{name}": array for name, array in fresh.exchange.state().optimizer.items()}
    np.savez(out, **saved)


framework, data_dir, *cases = sys.argv[1:]
for first in range(0, len(cases), 3):
    probe(framework, cases[first], data_dir, *cases[first + 1 : first + 3])
