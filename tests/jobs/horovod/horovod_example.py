"""Runs one of Horovod's own example scripts as it is, in each rank under `horovodrun`, with
what this machine and Keras 3 need around it, none of it Horovod's:

- MNIST from the local files (the script downloads it, and this machine has no internet);
- its `dataset.take(10000 // hvd.size())` steps capped at STEPS, to keep the test short;
- Keras 2's `opt.variables()`: Keras 3 made an optimizer's variables a list, which the script
  calls; no patch to Horovod can change that.

usage: horovod_example.py SCRIPT STEPS MNIST_DIR
"""

import runpy
import sys
from pathlib import Path

import keras
import tensorflow as tf

from hvd_train.data.mnist import mnist_arrays

script, steps, mnist_dir = sys.argv[1], int(sys.argv[2]), Path(sys.argv[3])
arrays = mnist_arrays(mnist_dir)


def load_data(path: str = "mnist.npz") -> tuple:
    return ((arrays["train_images"], arrays["train_labels"]),
            (arrays["test_images"], arrays["test_labels"]))  # fmt: skip


class CallableList(list):
    def __call__(self) -> list:
        return self


keras.datasets.mnist.load_data = load_data
take = tf.data.Dataset.take
tf.data.Dataset.take = lambda dataset, count, name=None: take(dataset, min(count, steps), name)
variables = keras.optimizers.Optimizer.variables
keras.optimizers.Optimizer.variables = property(lambda self: CallableList(variables.fget(self)))
sys.argv = [script]
runpy.run_path(script, run_name="__main__")
