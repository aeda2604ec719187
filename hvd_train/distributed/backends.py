"""Framework adapters, each made by name from the registry (`distributed/frameworks.py`) and
imported only when chosen, so no process loads two Horovod bindings and the package imports
with no framework installed."""

from __future__ import annotations

import importlib
import sys

from hvd_train.distributed.backend import Adapter, Elastic
from hvd_train.distributed.frameworks import (
    FRAMEWORKS,
    framework_named,
    import_quietly,
    use_framework,
)
from hvd_train.errors import UsageError


def create_adapter(name: str) -> Adapter:
    framework = framework_named(name)
    use_framework(name)
    import_quietly(name)
    for other in FRAMEWORKS.values():
        if other.name != name and other.binding in sys.modules:
            raise RuntimeError(
                f"{other.binding} is loaded already: one Horovod binding per process"
            )
    module_name, class_name = framework.adapter.split(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        if "horovod" in f"{error.name} {error}":
            raise UsageError(
                f"Horovod is missing or was built without {name} ({error}); run "
                "scripts/build-horovod.sh (part of `make setup`) to build it with every framework"
            ) from None
        raise UsageError(
            f"--framework {name} needs {name}, which is not installed ({error}); run `make setup`,"
            f" or `pip install 'hvd_train[{name}]'` and then scripts/build-horovod.sh"
        ) from None
    adapter: Adapter = getattr(module, class_name)()
    return adapter


__all__ = ["Adapter", "Elastic", "create_adapter"]
