"""Each registered framework's backend, imported only when chosen: `import hvd_train` loads no
framework, and a process loads one Horovod binding only (two are known to crash). Adding a
framework adds a line here (docs/adding-a-framework.md)."""

from __future__ import annotations

import sys
from collections.abc import Callable

from hvd_train.distributed.backend import Backend
from hvd_train.errors import UsageError
from hvd_train.frameworks import FRAMEWORKS, framework_named, import_quietly, use_framework


def _torch() -> Backend:
    from hvd_train.distributed.torch.backend import TorchBackend

    return TorchBackend()


def _tensorflow() -> Backend:
    from hvd_train.distributed.tensorflow.backend import TensorFlowBackend

    return TensorFlowBackend()


# By the registry's order (`FRAMEWORKS`): each framework's backend, made.
BACKENDS: dict[str, Callable[[], Backend]] = dict(zip(FRAMEWORKS, (_torch, _tensorflow),
                                                      strict=True))  # fmt: skip


def create_backend(name: str) -> Backend:
    """Framework `name`'s backend, its module imported now: one Horovod binding per process."""
    framework = framework_named(name)
    use_framework(name)
    import_quietly(name)
    for other in FRAMEWORKS.values():
        if other.name != name and other.binding in sys.modules:
            raise RuntimeError(
                f"{other.binding} is loaded already: one Horovod binding per process"
            )
    try:
        return BACKENDS[framework.name]()
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
