"""Framework adapters by name; each is imported only when chosen, so no process loads both
Horovod bindings and the package imports with neither framework installed."""

from __future__ import annotations

import importlib
import os
import sys

from hvd_train.adapters.base import Adapter, Arrays, Elastic
from hvd_train.errors import UsageError

ADAPTERS = {
    "torch": "hvd_train.adapters.torch:TorchAdapter",
    "tensorflow": "hvd_train.adapters.tensorflow:TensorFlowAdapter",
}
# What `hvd-train export` writes: each format, the framework that writes it, and the suffix of
# what it writes (a SavedModel is a folder).
EXPORT_FORMATS = {
    "torch": ("torch", ".pt2"),
    "onnx": ("torch", ".onnx"),
    "keras": ("tensorflow", ".keras"),
    "savedmodel": ("tensorflow", ".savedmodel"),
}
# Each binding loads its own copy of Horovod's core; two in one process are known to crash.
BINDINGS = {"torch": "horovod.torch", "tensorflow": "horovod.tensorflow"}


# Settings TensorFlow reads once, as it loads, applied where the environment gives none. On
# Linux, TensorFlow turns oneDNN's CPU kernels on by itself only on CPUs with neural-network
# instructions (AVX512-VNNI or -BF16, AVX-VNNI, AMX). On an AVX2-only CPU they made mnist_cnn's
# train step faster (docs/history.md, "Speed"). TF_ENABLE_ONEDNN_OPTS=0 turns them off.
TENSORFLOW_ENVIRONMENT = {"TF_CPP_MIN_LOG_LEVEL": "2", "TF_ENABLE_ONEDNN_OPTS": "1"}


def use_framework(framework: str) -> None:
    """Makes Keras run on `framework` (torch, for a Keras model trained under torch), and sets
    TENSORFLOW_ENVIRONMENT's defaults for TensorFlow. Both take effect only before Keras and
    TensorFlow are imported, so this is called before a Python recipe loads."""
    if framework == "tensorflow":
        for name, value in TENSORFLOW_ENVIRONMENT.items():
            os.environ.setdefault(name, value)
    if "keras" not in sys.modules:
        os.environ["KERAS_BACKEND"] = framework


def import_tensorflow_quietly() -> None:
    """Imports TensorFlow with its C++ start-up banners (absl's "All log messages before
    absl::InitializeLog() ...", oneDNN's notice) sent to /dev/null: they are written before
    TensorFlow's logging starts, so TF_CPP_MIN_LOG_LEVEL does not reach them.
    HVD_TRAIN_VERBOSE=1 keeps them. A failed import is left to the adapter to report."""
    if "tensorflow" in sys.modules or os.environ.get("HVD_TRAIN_VERBOSE", "0") != "0":
        return
    sys.stderr.flush()
    stderr, devnull = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    try:
        import tensorflow  # noqa: F401
    except ImportError:
        pass
    finally:
        os.dup2(stderr, 2)
        os.close(stderr)
        os.close(devnull)


def create_adapter(name: str) -> Adapter:
    use_framework(name)
    if name == "tensorflow":
        import_tensorflow_quietly()
    module_name, class_name = ADAPTERS[name].split(":")
    for other, binding in BINDINGS.items():
        if other != name and binding in sys.modules:
            raise RuntimeError(f"{binding} is loaded already: one Horovod binding per process")
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        if "horovod" in f"{error.name} {error}":
            raise UsageError(
                f"Horovod is missing or was built without {name} ({error}); run "
                "scripts/build-horovod.sh (part of `make setup`) to build it with both frameworks"
            ) from None
        raise UsageError(
            f"--framework {name} needs {name}, which is not installed ({error}); run `make setup`,"
            f" or `pip install 'hvd_train[{name}]'` and then scripts/build-horovod.sh"
        ) from None
    adapter: Adapter = getattr(module, class_name)()
    return adapter


__all__ = [
    "ADAPTERS",
    "EXPORT_FORMATS",
    "Adapter",
    "Arrays",
    "Elastic",
    "create_adapter",
    "import_tensorflow_quietly",
    "use_framework",
]
