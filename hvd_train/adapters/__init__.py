"""Framework adapters by name; each is imported only when chosen, so no process loads both
Horovod bindings and the package imports with neither framework installed."""

from __future__ import annotations

import importlib
import os
import sys

from hvd_train.adapters.base import Adapter, Arrays
from hvd_train.errors import UsageError

ADAPTERS = {
    "torch": "hvd_train.adapters.torch:TorchAdapter",
    "tensorflow": "hvd_train.adapters.tensorflow:TensorFlowAdapter",
}
# Each binding loads its own copy of Horovod's core; two in one process are known to crash.
BINDINGS = {"torch": "horovod.torch", "tensorflow": "horovod.tensorflow"}


def use_keras_backend(framework: str) -> None:
    """Makes Keras run on `framework` (torch, for a Keras model trained under torch). It takes
    effect only before Keras is imported, so it is called before a Python recipe loads."""
    if "keras" not in sys.modules:
        os.environ["KERAS_BACKEND"] = framework


def create_adapter(name: str) -> Adapter:
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


__all__ = ["ADAPTERS", "Adapter", "Arrays", "create_adapter", "use_keras_backend"]
