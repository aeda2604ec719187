"""The recipe: what to train (data, model, loss) and how (optimizer, schedule, Horovod).

One `Recipe` type, made two ways: from a framework-neutral TOML file (`recipe/toml.py`), whose
model is a list of layers that both frameworks build, or in Python (`recipe/python.py`), whose
model comes from the user's own function for torch and/or Keras. It is checked once, when made;
everything downstream trusts it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from hvd_train.callbacks import Callback
from hvd_train.data.transforms import Transforms, parse_transforms
from hvd_train.errors import UsageError
from hvd_train.frameworks import FRAMEWORKS, OWN_MODELS, framework_named
from hvd_train.recipe.layers import Layer, checked_layers
from hvd_train.recipe.scoring import BUILT_IN, NAME, Metric, metric_name
from hvd_train.recipe.settings import (
    KEY_SECTIONS,
    LOADING_KEYS,
    LOSSES,
    RENAMED,
    Checkpoints,
    Data,
    ExchangeSettings,
    Loading,
    Optimizer,
    Output,
    Schedule,
    Settings,
)


def checked_callbacks(callbacks: Any) -> tuple[Callback, ...]:
    if isinstance(callbacks, Callback) or not isinstance(callbacks, tuple | list):
        raise UsageError(f"callbacks: expected a list of callbacks, got {callbacks!r}")
    for callback in callbacks:
        if isinstance(callback, type) and issubclass(callback, Callback):
            raise UsageError(
                f"callbacks: {callback.__name__} is a class; give an object of it: "
                f"{callback.__name__}()"
            )
        if not isinstance(callback, Callback):
            raise UsageError(
                f"callbacks: {callback!r} is not a callback; subclass hvd_train.Callback and "
                "override the events it needs (on_step_end, on_evaluate, ...)"
            )
    return tuple(callbacks)


@dataclass(frozen=True)
class Recipe:
    """A training recipe. In a Python recipe file:

        recipe = Recipe(data=Data("mnist"), torch_model=build, schedule=Schedule(epochs=2))

    `data`: a `Data` table, or a function returning `((x_train, y_train), (x_test, y_test))`
    (arrays, or objects with `len()` whose `[indices]` gives `(x, y)`), or with its own
    validation split `(train, validation, test)`, or a dict of those names (a `DatasetDict`).
    The model: `layers` (the neutral list; both frameworks), or `torch_model` (a function
    returning a `torch.nn.Module`) and/or `keras_model` (returning a Keras 3 model, which
    trains under TensorFlow and, on Keras's torch backend, under torch too).
    `loss`: "cross_entropy" on the model's logits (N, ..., C) for integer labels (N, ...), or
    a function `(outputs, labels) -> mean loss` in the framework's own tensors, which takes
    the labels in the dtypes and shapes the data gives (a tuple of them, for several targets).
    `metrics`: what evaluation reports besides the loss: names of built-ins ("accuracy",
    "top_k_accuracy", "mse", "mae") and functions `(outputs, labels) -> (sum, count)` on NumPy
    arrays, recorded by their names. Default: accuracy with cross_entropy, else none.
    `optimizer`: an `Optimizer(...)` table, or a function making the framework's own
    optimizer (`Optimizer`'s `function` says how).
    `loading`: how the training batches are read (`Loading(workers=4)`), for either kind of
    `data`; in TOML and `--set`, its keys sit in `[data]`.
    `transform`: `(x, rng) -> x`, one training example's input (height, width, channels) and
    a NumPy Generator seeded from (seed, epoch, example); it runs in the data workers. With
    `Data(...)`, its `transforms` list does the same from settings.
    `callbacks`: `hvd_train.Callback` objects, called at the loop's events on every rank.
    `output`: `Output(trackers=["mlflow"])`, where the records go besides the run's folder.
    """

    data: Data | Callable[[], Any]
    layers: tuple[Layer, ...] = ()
    torch_model: Callable[[], Any] | None = None
    keras_model: Callable[[], Any] | None = None
    loss: str | Callable[[Any, Any], Any] = "cross_entropy"
    metrics: tuple[str | Metric, ...] | None = None
    optimizer: Optimizer | Callable[..., Any] = field(default_factory=Optimizer)
    schedule: Schedule = field(default_factory=Schedule)
    horovod: ExchangeSettings = field(default_factory=ExchangeSettings)
    checkpoints: Checkpoints = field(default_factory=Checkpoints)
    loading: Loading = field(default_factory=Loading)
    output: Output = field(default_factory=Output)
    transform: Callable[[Any, Any], Any] | None = None
    callbacks: tuple[Callback, ...] = ()
    description: str = ""
    name: str = "recipe"  # set by the loader: the file's or object's name
    source: str = ""  # set by the loader: where the recipe came from
    code_hash: str = ""  # set by the loader of a Python recipe: its code's hash

    def __post_init__(self) -> None:
        if self.transform is not None and not callable(self.transform):
            raise UsageError("transform: expected a function (x, rng) -> x")
        object.__setattr__(self, "callbacks", checked_callbacks(self.callbacks))
        if not isinstance(self.data, Data) and not callable(self.data):
            raise UsageError(
                "data: expected Data(...) or a function returning "
                "((x_train, y_train), (x_test, y_test))"
            )
        builders = (self.torch_model, self.keras_model)
        if bool(self.layers) == any(builders):
            raise UsageError(
                "model: give either layers (the neutral list) or torch_model and/or keras_model"
            )
        if not all(builder is None or callable(builder) for builder in builders):
            raise UsageError("model: torch_model and keras_model must be functions returning one")
        if not callable(self.loss) and self.loss not in LOSSES:
            raise UsageError(
                f"model.loss: unknown value {self.loss!r}; choose one of {', '.join(LOSSES)} "
                "or give a function"
            )
        object.__setattr__(self, "metrics", self._checked_metrics())
        if callable(self.optimizer):  # the framework's own optimizer, made by the recipe
            object.__setattr__(self, "optimizer", Optimizer(function=self.optimizer))
        tables = ((self.optimizer, Optimizer), (self.schedule, Schedule),
                  (self.horovod, ExchangeSettings), (self.checkpoints, Checkpoints))  # fmt: skip
        for table, cls in tables:
            if not isinstance(table, cls):
                raise UsageError(f"{cls.section}: expected {cls.__name__}(...), got {table!r}")
        if self.schedule.early_stopping is not None:
            monitor = self.schedule.early_stopping["monitor"]
            self._check_monitor(
                "schedule.early_stopping", "schedule.early_stopping.monitor", monitor
            )
        if self.checkpoints.keep_best:
            self._check_monitor(
                "checkpoints.keep_best", "checkpoints.monitor", self.checkpoints.monitor
            )
        if self.layers:
            if not isinstance(self.data, Data):
                raise UsageError("model.layers: need data given as Data(...) to check shapes")
            assert self.data.input_shape is not None and self.data.num_classes is not None
            layers = checked_layers(self.layers, self.data.input_shape, self.data.num_classes)
            object.__setattr__(self, "layers", layers)

    def transforms(self) -> Transforms:
        """The training transforms and evaluation's."""
        if self.transform is not None:
            return Transforms((self.transform,), ())
        entries = self.data.transforms if isinstance(self.data, Data) else None
        return parse_transforms(entries or ())

    def _checked_metrics(self) -> tuple[str | Metric, ...] | None:
        if self.metrics is None:
            return None
        if isinstance(self.metrics, str) or not isinstance(self.metrics, tuple | list):
            raise UsageError(f"model.metrics: expected a list of metrics, got {self.metrics!r}")
        names = [metric_name(metric) for metric in self.metrics]
        for metric, name in zip(self.metrics, names, strict=True):
            if isinstance(metric, str) and metric not in BUILT_IN:
                raise UsageError(
                    f"model.metrics: unknown metric {metric!r}; choose from "
                    f"{', '.join(BUILT_IN)} or give a function (outputs, labels) -> (sum, count)"
                )
            if not isinstance(metric, str) and not (callable(metric) and NAME.fullmatch(name)):
                raise UsageError(
                    f"model.metrics: {metric!r} is not a metric; give a named function "
                    "(def, not lambda) (outputs, labels) -> (sum, count), or a built-in's name"
                )
        if len(set(names)) < len(names):
            raise UsageError(f"model.metrics: {names} names a metric twice; name each once")
        return tuple(self.metrics)

    def validation_watcher(self) -> str | None:
        """The setting that watches the validation split (early stopping, the best
        checkpoints), if any."""
        if self.schedule.early_stopping is not None:
            return "schedule.early_stopping"
        return "checkpoints.keep_best" if self.checkpoints.keep_best else None

    def _check_monitor(self, setting: str, key: str, monitor: str) -> None:
        """Early stopping and the best checkpoints watch a figure of the validation split that
        the run reports (`setting` is the one that watches, `key` where it names it)."""
        reported = [f"val_{name}" for name in ["loss", *self.metric_functions]]
        if isinstance(self.data, Data) and not self.loading.validation_fraction:
            raise UsageError(
                f"{setting}: it watches the validation split, which this recipe has none of; "
                "set data.validation_fraction (0.1 is usual)"
            )
        if monitor not in reported:
            raise UsageError(
                f"{key}: the run reports no {monitor!r}; choose one of {', '.join(reported)}"
            )

    @property
    def metric_functions(self) -> dict[str, Metric]:
        """The metrics evaluation reports, by name: the recipe's, or its loss's default."""
        default = ("accuracy",) if self.loss == "cross_entropy" else ()
        chosen = default if self.metrics is None else self.metrics
        return {metric_name(m): BUILT_IN[m] if isinstance(m, str) else m for m in chosen}

    @property
    def frameworks(self) -> tuple[str, ...]:
        """The frameworks this recipe's model can be built under: every one for the neutral
        list, else those that train one of its own models."""
        return tuple(name for name, framework in FRAMEWORKS.items()
                     if self.layers or set(framework.models) & set(self.own_models))  # fmt: skip

    @property
    def own_models(self) -> tuple[str, ...]:
        """The layouts of the recipe's own models ("torch", "keras"), of those it gives."""
        return tuple(layout for layout, name in OWN_MODELS.items() if getattr(self, name))

    def layout(self, framework: str) -> str:
        """How checkpoints hold this model's weights under `framework`: "neutral" (moves
        between frameworks), or that of the recipe's own model the framework takes first:
        "torch" (state_dict) or "keras" (weights)."""
        if self.layers:
            return "neutral"
        return next(m for m in FRAMEWORKS[framework].models if m in self.own_models)

    def check_framework(self, framework: str) -> None:
        if framework not in self.frameworks:
            given = " and ".join(OWN_MODELS[m] for m in self.own_models)
            wanted = " or ".join(OWN_MODELS[m] for m in framework_named(framework).models)
            raise UsageError(
                f"recipe {self.name!r} supports {' and '.join(self.frameworks)} only (it gives "
                f"{given}); use --framework {self.frameworks[0]}, or give the recipe a {wanted}"
            )

    def with_overrides(self, overrides: Mapping[str, Any]) -> Recipe:
        """The recipe with settings replaced: keys `section.key` or just `key` (they are
        unique), checked exactly as the recipe's own values are."""
        tables: dict[str, dict[str, Any]] = {}
        for key, value in overrides.items():
            section, _, name = key.rpartition(".")
            section = section or KEY_SECTIONS.get(name, "")
            if name in RENAMED:
                raise UsageError(f"{key}: renamed; use {RENAMED[name]}")
            if KEY_SECTIONS.get(name) != section:
                raise UsageError(
                    f"{key}: unknown setting; use section.key with a key of the recipe reference "
                    "(docs/recipes.md), like schedule.epochs"
                )
            tables.setdefault("loading" if name in LOADING_KEYS else section, {})[name] = value
        changes: dict[str, Any] = {}
        for attribute, values in tables.items():
            current = getattr(self, attribute)
            if not isinstance(current, Settings):
                raise UsageError(
                    f"{attribute}: this recipe's data is a Python function, not a table"
                )
            changes[attribute] = dataclasses.replace(current, **values)  # type: ignore[type-var]
        return dataclasses.replace(self, **changes)

    def settings_table(self) -> dict[str, Any]:
        """The effective recipe as TOML tables: what a checkpoint records it trained with."""
        python = f"python recipe {self.source}"
        model: dict[str, Any] = {"loss": self.loss if isinstance(self.loss, str) else python}
        if self.layers:
            model["layers"] = [{"type": layer.type, **layer.params} for layer in self.layers]
        else:
            model["python"] = self.source
        if self.metrics is not None:  # given: recorded (the default is the loss's)
            model["metrics"] = list(self.metric_functions)
        table = {
            "description": self.description,
            "data": {
                **(self.data.table() if isinstance(self.data, Data) else {"python": python}),
                **self.loading.table(),
            },
            "model": model,
        }
        for section in ("optimizer", "schedule", "horovod", "checkpoints"):
            table[section] = getattr(self, section).table()
        if self.output.trackers:
            table["output"] = self.output.table()
        return table

    def recipe_hash(self) -> str:
        """A short hash of every setting that shapes what trains (overrides included) and of a
        Python recipe's code."""
        settings = {k: v for k, v in self.settings_table().items() if k != "output"}
        text = json.dumps([settings, self.code_hash], sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]
