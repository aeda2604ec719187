"""Recipes: a framework-neutral TOML description of model, data, optimizer and schedule.

A recipe is read and validated once, here; everything downstream trusts it. Every problem is
reported as one line naming the file, the key and what is wrong.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import tomllib
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, cast

from hvd_train.errors import UsageError

# Parameters each layer type takes: name -> (type, smallest allowed value).
LAYER_PARAMS: dict[str, dict[str, tuple[type, float]]] = {
    "conv2d": {"filters": (int, 1), "kernel_size": (int, 1)},
    "maxpool2d": {"pool_size": (int, 1)},
    "dropout": {"rate": (float, 0.0)},
    "flatten": {},
    "dense": {"units": (int, 1)},
    "relu": {},
    "softmax": {},
}
DATASETS = ("mnist",)
LOSSES = ("cross_entropy",)
OPTIMIZERS = ("sgd", "adam", "adamw")
LR_SCALING = ("linear", "sqrt", "none")
DECAYS = ("none", "cosine")


@dataclass(frozen=True)
class Layer:
    type: str
    params: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class OptimizerConfig:
    name: str
    learning_rate: float
    momentum: float
    weight_decay: float
    gradient_clip_norm: float  # 0 turns clipping off


@dataclass(frozen=True)
class ScheduleConfig:
    epochs: int
    batch_size: int  # per rank
    lr_scaling: str
    warmup_epochs: float
    decay: str


@dataclass(frozen=True)
class HorovodConfig:
    fp16_compression: bool
    backward_passes_per_step: int


@dataclass(frozen=True)
class Recipe:
    name: str
    source: str
    text: str  # the TOML it was read from, stored with checkpoints
    dataset: str
    input_shape: tuple[int, int, int]  # height, width, channels
    num_classes: int
    layers: tuple[Layer, ...]
    loss: str
    optimizer: OptimizerConfig
    schedule: ScheduleConfig
    horovod: HorovodConfig

    def with_overrides(
        self, epochs: int | None, batch_size: int | None, learning_rate: float | None
    ) -> Recipe:
        """The recipe with the CLI's --epochs, --batch-size and --lr applied where given."""
        schedule = dataclasses.replace(
            self.schedule,
            epochs=epochs or self.schedule.epochs,
            batch_size=batch_size or self.schedule.batch_size,
        )
        optimizer = dataclasses.replace(
            self.optimizer, learning_rate=learning_rate or self.optimizer.learning_rate
        )
        return dataclasses.replace(self, schedule=schedule, optimizer=optimizer)

    def architecture_hash(self) -> str:
        """A short hash of what decides the shapes of the weights."""
        return _short_hash([self.input_shape, self.num_classes, self.layers])

    def recipe_hash(self) -> str:
        """A short hash of every setting, overrides included."""
        settings = dataclasses.asdict(self)
        for key in ("name", "source", "text"):
            del settings[key]
        return _short_hash(settings)


def _short_hash(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, default=dataclasses.asdict)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


class _Table:
    """One TOML table being validated; knows its place in the file for error messages."""

    def __init__(self, data: Any, source: str, where: str) -> None:
        if not isinstance(data, dict):
            raise UsageError(f"{source}: {where}: expected a table; see recipes/mnist_cnn.toml")
        self.data, self.source, self.where = data, source, where
        self.read: set[str] = set()

    def fail(self, key: str, problem: str) -> UsageError:
        name = f"{self.where}.{key}" if self.where else key
        return UsageError(f"{self.source}: {name}: {problem}")

    def get(self, key: str, kind: type, default: Any = None, minimum: float | None = None) -> Any:
        self.read.add(key)
        if key not in self.data:
            if default is None:
                raise self.fail(key, "missing; add it to the recipe")
            return default
        value: Any = self.data[key]
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if type(value) is not kind:
            raise self.fail(key, f"expected {kind.__name__}, got {value!r}")
        if minimum is not None and cast(float, value) < minimum:
            raise self.fail(key, f"{value!r} is out of range; it must be at least {minimum}")
        return value

    def choice(self, key: str, choices: tuple[str, ...], default: str | None = None) -> str:
        value: str = self.get(key, str, default)
        if value not in choices:
            raise self.fail(key, f"unknown value {value!r}; choose one of {', '.join(choices)}")
        return value

    def positive(self, key: str, kind: type, default: Any = None) -> Any:
        value = self.get(key, kind, default)
        if value <= 0:
            raise self.fail(key, f"{value!r} is out of range; it must be positive")
        return value

    def table(self, key: str) -> _Table:
        self.read.add(key)
        if key not in self.data:
            raise self.fail(key, "missing table; add it to the recipe")
        return _Table(self.data[key], self.source, f"{self.where}.{key}" if self.where else key)

    def finish(self) -> None:
        unknown = sorted(set(self.data) - self.read)
        if unknown:
            raise self.fail(unknown[0], "unknown key; check its spelling against the README")


def _layer(raw: Any, source: str, index: int) -> Layer:
    table = _Table(raw, source, f"model.layers[{index}]")
    kind = table.choice("type", tuple(LAYER_PARAMS))
    params = {}
    for name, (param_type, minimum) in LAYER_PARAMS[kind].items():
        params[name] = table.get(name, param_type, minimum=minimum)
    if kind == "dropout" and not params["rate"] < 1:
        raise table.fail("rate", f"{params['rate']!r} is out of range; it must be below 1")
    table.finish()
    return Layer(kind, params)


def _layers(model: _Table) -> tuple[Layer, ...]:
    raw = model.get("layers", list)
    layers = tuple(_layer(item, model.source, i) for i, item in enumerate(raw))
    if not layers or layers[-1].type != "softmax":
        raise model.fail("layers", "must end with a softmax layer (cross_entropy needs it)")
    if any(layer.type == "softmax" for layer in layers[:-1]):
        raise model.fail("layers", "softmax may only be the last layer")
    return layers


def _check_shapes(
    model: _Table, layers: tuple[Layer, ...], shape: tuple[int, int, int], num_classes: int
) -> None:
    """Follows the input through the layers, so a layer that cannot fit fails here, not later."""
    height, width, flat = shape[0], shape[1], False
    for index, layer in enumerate(layers):
        where = f"layers[{index}]"
        if layer.type in ("conv2d", "maxpool2d") and flat:
            raise model.fail(where, f"{layer.type} needs an image, but it follows flatten or dense")
        if layer.type == "conv2d":
            height -= layer.params["kernel_size"] - 1
            width -= layer.params["kernel_size"] - 1
        elif layer.type == "maxpool2d":
            height //= layer.params["pool_size"]
            width //= layer.params["pool_size"]
        elif layer.type in ("flatten", "dense"):
            if layer.type == "dense" and not flat:
                raise model.fail(where, "dense needs a flat input; add a flatten layer before it")
            flat = True
        if height < 1 or width < 1:
            raise model.fail(where, f"{layer.type} does not fit its input; make it smaller")
    if layers[-2].type != "dense" or layers[-2].params["units"] != num_classes:
        raise model.fail(
            "layers",
            f"must end with a dense layer of {num_classes} units (the "
            "number of classes) and softmax",
        )


def parse_recipe(text: str, name: str, source: str) -> Recipe:
    """Validates recipe TOML `text` read from `source`; raises UsageError on any problem."""
    try:
        root = _Table(tomllib.loads(text), source, "")
    except tomllib.TOMLDecodeError as error:
        raise UsageError(f"{source}: not valid TOML ({error}); fix the syntax") from None
    data, model = root.table("data"), root.table("model")
    optimizer, schedule, horovod = (
        root.table("optimizer"),
        root.table("schedule"),
        root.table("horovod"),
    )
    root.get("description", str, "")
    shape = data.get("input_shape", list)
    if len(shape) != 3 or not all(isinstance(x, int) and x > 0 for x in shape):
        raise data.fail(
            "input_shape", "expected [height, width, channels], three positive integers"
        )
    recipe = Recipe(
        name=name,
        source=source,
        text=text,
        dataset=data.choice("dataset", DATASETS),
        input_shape=(shape[0], shape[1], shape[2]),
        num_classes=data.positive("num_classes", int),
        layers=_layers(model),
        loss=model.choice("loss", LOSSES),
        optimizer=OptimizerConfig(
            name=optimizer.choice("name", OPTIMIZERS),
            learning_rate=optimizer.positive("learning_rate", float),
            momentum=optimizer.get("momentum", float, 0.0, minimum=0.0),
            weight_decay=optimizer.get("weight_decay", float, 0.0, minimum=0.0),
            gradient_clip_norm=optimizer.get("gradient_clip_norm", float, 0.0, minimum=0.0),
        ),
        schedule=ScheduleConfig(
            epochs=schedule.positive("epochs", int),
            batch_size=schedule.positive("batch_size", int),
            lr_scaling=schedule.choice("lr_scaling", LR_SCALING),
            warmup_epochs=schedule.get("warmup_epochs", float, 0.0, minimum=0.0),
            decay=schedule.choice("decay", DECAYS),
        ),
        horovod=HorovodConfig(
            fp16_compression=horovod.get("fp16_compression", bool, False),
            backward_passes_per_step=horovod.positive("backward_passes_per_step", int, 1),
        ),
    )
    for table in (root, data, model, optimizer, schedule, horovod):
        table.finish()
    _check_shapes(model, recipe.layers, recipe.input_shape, recipe.num_classes)
    return recipe


def packaged_recipes() -> list[str]:
    return sorted(
        Path(entry.name).stem
        for entry in resources.files("hvd_train.recipes").iterdir()
        if entry.name.endswith(".toml")
    )


def load_recipe(name_or_path: str) -> Recipe:
    """A packaged recipe by name (`mnist_cnn`) or a recipe file by path (`my.toml`)."""
    if name_or_path.endswith(".toml") or "/" in name_or_path:
        path = Path(name_or_path)
        try:
            text = path.read_text()
        except OSError as error:
            raise UsageError(
                f"cannot read recipe {path}: {error.strerror}; check the --recipe path"
            ) from None
        return parse_recipe(text, path.stem, str(path))
    entry = resources.files("hvd_train.recipes") / f"{name_or_path}.toml"
    if not entry.is_file():
        known = ", ".join(packaged_recipes())
        raise UsageError(
            f"unknown recipe {name_or_path!r}; use one of {known} or a path to a .toml file"
        )
    return parse_recipe(entry.read_text(), name_or_path, f"recipes/{name_or_path}.toml")
