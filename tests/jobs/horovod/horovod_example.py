"""Runs one of Horovod's own MNIST example scripts in each rank under `horovodrun`, with MNIST
from the local files: the script downloads it (`keras.datasets.mnist.load_data`), and this
machine has no internet. Nothing else is changed around the script; what the test changed in
it (Keras 3's two lines, its steps capped) is in the copy it runs.

usage: horovod_example.py SCRIPT MNIST_DIR
"""

import runpy
import sys
from pathlib import Path

import keras
import tensorflow as tf

from hvd_train.data.mnist import mnist_arrays

script, mnist_dir = sys.argv[1], Path(sys.argv[2])
arrays = mnist_arrays(mnist_dir)


def load_data(path: str = "mnist.npz") -> tuple:
    return ((arrays["train_images"], arrays["train_labels"]),
            (arrays["test_images"], arrays["test_labels"]))  # fmt: skip


keras.datasets.mnist.load_data = tf.keras.datasets.mnist.load_data = load_data
sys.argv = [script]
runpy.run_path(script, run_name="__main__")
