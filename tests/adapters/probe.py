"""Runs one framework's adapter in its own process (so pytest never loads a Horovod binding)
and saves what the layout tests compare.

usage: probe.py FRAMEWORK DATA_DIR WEIGHTS.safetensors OUT.npz
Saves `weights.<name>` after loading WEIGHTS, `logits` for the first 32 test images, and
`optimizer.<name>` before and `restored.<name>` after an optimizer-state round trip.
"""

import sys
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file

from hvd_train.adapters import create_adapter
from hvd_train.mnist import load_mnist
from hvd_train.recipe import load_recipe

framework, data_dir, weights_path, out = sys.argv[1:5]
recipe = load_recipe("mnist_cnn")
data = load_mnist(Path(data_dir))
adapter = create_adapter(framework)
adapter.init()
adapter.build(recipe, seed=0)
adapter.load_weights(load_file(weights_path))
saved = {f"weights.{name}": array for name, array in adapter.weights().items()}
saved["logits"] = adapter.logits(data.test_images[:32])

for step in range(2):  # give the optimizer some state
    batch = slice(64 * step, 64 * (step + 1))
    adapter.train_step(data.train_images[batch], data.train_labels[batch], 0.001, step)
state = adapter.optimizer_state()
fresh = create_adapter(framework)
fresh.init()
fresh.build(recipe, seed=1)
fresh.load_optimizer_state(state)
saved |= {f"optimizer.{name}": array for name, array in state.items()}
saved |= {f"restored.{name}": array for name, array in fresh.optimizer_state().items()}
np.savez(out, **saved)
