"""The frameworks hvd_train trains under, registered in one place, as names: each entry says
what the rest of the package needs to know of a framework: its module, its Horovod binding,
which of a recipe's own models it trains, its export formats, its packages and its environment.
It sits on the package's lowest floor, so that the recipe, the builders and the distributed
layer all read it; it imports no framework. Nothing outside a framework's backend package and
builder, this file and the two lists that import them (`distributed/backends.py`,
`builders/__init__.py`) names a framework: adding one is a backend, a builder, an entry here and
a line in each list (docs/adding-a-framework.md).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field

from hvd_train.errors import UsageError


@dataclass(frozen=True)
class Framework:
    name: str  # --framework's value
    module: str  # its Python module
    display: str  # its name in prose, and in `horovodrun --check-build`'s list
    binding: str  # Horovod's module for it: two in one process are known to crash
    # The recipe's own models it trains, by the layout a checkpoint holds them in: "torch"
    # (Recipe.torch_model) or "keras" (Recipe.keras_model), the one it takes first first. The
    # first is also the kind of model its builder makes (`builders.builder`).
    models: tuple[str, ...]
    # `hvd-train export`'s formats it writes: each one's suffix, and what it is for --help.
    exports: dict[str, tuple[str, str]]
    packages: tuple[str, ...]  # the distributions that provide it (any one of them)
    # Settings it reads once, as it loads, applied where the environment gives none.
    environment: dict[str, str] = field(default_factory=dict)
    # Whether its module's import writes C++ start-up banners before its logging starts: it is
    # then imported with them sent to /dev/null (HVD_TRAIN_VERBOSE=1 keeps them).
    noisy_import: bool = False


FRAMEWORKS = {
    framework.name: framework
    for framework in (
        Framework(
            name="torch",
            module="torch",
            display="PyTorch",
            binding="horovod.torch",
            models=("torch", "keras"),  # a Keras 3 model on Keras's torch backend
            exports={
                "torch": (
                    ".pt2",
                    "a torch.export program (.pt2; TorchScript .pt where export cannot)",
                ),
                "onnx": (".onnx", "ONNX"),
            },
            packages=("torch",),
        ),
        Framework(
            name="tensorflow",
            module="tensorflow",
            display="TensorFlow",
            binding="horovod.tensorflow",
            models=("keras",),
            exports={
                "keras": (".keras", "a .keras file"),
                "savedmodel": (".savedmodel", "a TensorFlow SavedModel folder"),
            },
            packages=("tensorflow", "tensorflow-cpu"),
            # On Linux, TensorFlow turns oneDNN's CPU kernels on by itself only on CPUs with
            # neural-network instructions (AVX512-VNNI or -BF16, AVX-VNNI, AMX). On an
            # AVX2-only CPU they made mnist_cnn's train step faster (docs/history.md, "Speed").
            environment={"TF_CPP_MIN_LOG_LEVEL": "2", "TF_ENABLE_ONEDNN_OPTS": "1"},
            noisy_import=True,
        ),
    )
}
DEFAULT_FRAMEWORK = "torch"
# A recipe's own models, by the layout a checkpoint holds each in (`Framework.models`): the
# Recipe field that gives it.
OWN_MODELS = {"torch": "torch_model", "keras": "keras_model"}
# What `hvd-train export` writes: each format, the framework that writes it, and its suffix.
EXPORT_FORMATS = {
    format: (framework.name, suffix)
    for framework in FRAMEWORKS.values()
    for format, (suffix, _) in framework.exports.items()
}


def framework_named(name: str) -> Framework:
    if name not in FRAMEWORKS:
        raise UsageError(
            f"unknown framework {name!r}; choose {' or '.join(FRAMEWORKS)} (--framework)"
        )
    return FRAMEWORKS[name]


def use_framework(name: str) -> None:
    """Makes Keras run on framework `name` (torch, for a Keras model trained under torch), and
    sets the framework's environment defaults. Both take effect only before Keras and the
    framework are imported, so this is called before a Python recipe loads."""
    for variable, value in framework_named(name).environment.items():
        os.environ.setdefault(variable, value)
    if "keras" not in sys.modules:
        os.environ["KERAS_BACKEND"] = name


def import_quietly(name: str) -> None:
    """Imports framework `name`'s module, where its import is noisy, with what it writes to
    stderr before its logging starts (TensorFlow's absl "All log messages before
    absl::InitializeLog() ...", oneDNN's notice) sent to /dev/null: its log level does not reach
    them. HVD_TRAIN_VERBOSE=1 keeps them. A failed import is left to `create_backend` to report."""
    framework = framework_named(name)
    module = framework.module
    if not framework.noisy_import or module in sys.modules:
        return
    if os.environ.get("HVD_TRAIN_VERBOSE", "0") != "0":
        return
    sys.stderr.flush()
    stderr, devnull = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    try:
        __import__(module)
    except ImportError:
        pass
    finally:
        os.dup2(stderr, 2)
        os.close(stderr)
        os.close(devnull)
