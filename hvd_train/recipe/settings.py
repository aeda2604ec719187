"""A recipe's settings tables: every key, its type, its default and its range, in one place.

The same checks run on a TOML table, on a Python recipe's arguments and on a `--set` override,
so a mistake reads the same wherever it was made: `optimizer.learning_rate: -1.0 is out of
range; it must be positive`. The loaders put the recipe's file in front.
"""

from __future__ import annotations

import dataclasses
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from hvd_train.data.base import Splits
from hvd_train.data.pipeline import DEFAULT_TIMEOUT
from hvd_train.data.sources import SOURCES, checked_source_keys, load_from_source
from hvd_train.data.transforms import parse_transforms
from hvd_train.errors import UsageError
from hvd_train.recipe.learning_rate import parse_decay
from hvd_train.recipe.rules import Rule

LOSSES = ("cross_entropy",)
OPTIMIZERS = ("sgd", "adam", "adamw", "rmsprop")
LR_SCALING = ("linear", "sqrt", "none")
PRECISIONS = ("fp32", "bf16-mixed", "fp16-mixed")
TRACKERS = ("mlflow", "csv")  # where records go besides the run's own (training/trackers.py)
# How gradients travel between the ranks: as they are (fp32), or cast to 16 bits and back.
# bf16 keeps fp32's range; Horovod reduces it through the patch series' 13-bfloat16.patch.
COMPRESSIONS = ("none", "fp16", "bf16")
# What each rank keeps of the training state: all of it, its part of the optimizer state
# (ZeRO-1), or that and its part of the averaged gradients (ZeRO-2). docs/sharding.md.
SHARDS = ("none", "optimizer", "gradients")
# fp16's narrow range: its loss is scaled up before the backward pass and the gradients down
# before the update, which is skipped (and the scale lowered) where they overflow.
LOSS_SCALED = "fp16-mixed"
# The optimizers' constants, the same under every framework (torch's defaults): Adam's and
# RMSprop's epsilon (added to the root of the squared-gradient average), and RMSprop's decay of
# that average (torch's alpha, Keras's rho).
EPSILON, RMSPROP_DECAY = 1e-8, 0.99
# Early stopping's keys and defaults: stop when `monitor` has not improved by more than
# `min_delta` (down with mode "min", up with "max") over `patience` evaluations.
EARLY_STOPPING = {"monitor": "val_loss", "patience": 3, "mode": "min", "min_delta": 0.0}
# How a table records a Python recipe's own function (a decay): by name, which its code gives back.
PYTHON_FUNCTION = "python function "


def function_name(function: Callable[..., Any]) -> str:
    """A Python recipe's own function as settings and messages name it."""
    return getattr(function, "__qualname__", repr(function))


def setting(default: Any = dataclasses.MISSING, **rule: Any) -> Any:
    """A settings field with its default and the `Rule` its values must obey."""
    return field(default=default, metadata={"rule": Rule(**rule)})


class Settings:
    """A table of settings; checks every value it is given when it is made."""

    section: ClassVar[str]

    def __post_init__(self) -> None:
        for item in dataclasses.fields(self):  # type: ignore[arg-type]
            value = getattr(self, item.name)
            if "rule" in item.metadata and value is not None:
                checked = item.metadata["rule"].check(f"{self.section}.{item.name}", value)
                object.__setattr__(self, item.name, checked)

    def check_read(self) -> None:
        """Refuses a value, other than its key's default, that nothing chosen reads
        (`READ_ONLY_WHEN`): it would do nothing. Called once the table's own checks passed."""
        for key, when in READ_ONLY_WHEN.get(type(self).__name__, {}).items():
            if getattr(self, key) != _default(type(self), key) and not when.reads(self):
                raise self.fail(
                    key,
                    f"set, but nothing chosen reads it (only {when.reader} does); choose "
                    f"that, or leave {key} out",
                )

    def fail(self, key: str, problem: str) -> UsageError:
        return UsageError(f"{self.section}.{key}: {problem}")

    def table(self) -> dict[str, Any]:
        """The settings as a TOML table: every key that has a value."""
        return {
            key: list(value) if isinstance(value, tuple) else value
            for key, value in dataclasses.asdict(self).items()  # type: ignore[call-overload]
            if value is not None
        }


@dataclass(frozen=True)
class Data(Settings):
    """Where the examples come from: `mnist`; `npz`, the user's arrays in a file (`path`,
    relative to the recipe); `folder`, images in one folder per class under `path`/train and
    `path`/test (`resize`: to `input_shape`); `parquet`, tables of the `input` and `label`
    columns in the `train*.parquet` and `test*.parquet` files of `path`; `records`, ArrayRecord
    files in `path` (`hvd-train write-records`); or `synthetic`, generated on the fly. Which
    source reads which key: `data/sources.py`."""

    section = "data"
    dataset: str = setting(kind=str, choices=tuple(SOURCES))
    input_shape: tuple[int, int, int] | None = None  # height, width, channels
    num_classes: int | None = setting(None, kind=int, positive=True)
    path: str | None = setting(None, kind=str)
    train_samples: int | None = setting(None, kind=int, positive=True)
    test_samples: int | None = setting(None, kind=int, positive=True)
    resize: bool | None = setting(None, kind=bool)
    input: str | None = setting(None, kind=str)  # parquet: the column of images
    label: str | None = setting(None, kind=str)  # parquet: the column of class labels
    transforms: tuple[Any, ...] | None = None  # tables: hvd_train/data/transforms.py

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.transforms is not None:
            if not isinstance(self.transforms, list | tuple):
                raise self.fail("transforms", "expected a list of tables, like [{ type = ... }]")
            object.__setattr__(self, "transforms", tuple(self.transforms))
            parse_transforms(self.transforms)
        if self.input_shape is not None:
            shape = self.input_shape
            if not (
                isinstance(shape, list | tuple)
                and len(shape) == 3
                and all(type(x) is int and x > 0 for x in shape)
            ):
                raise self.fail(
                    "input_shape", "expected [height, width, channels], three positive integers"
                )
            object.__setattr__(self, "input_shape", tuple(shape))
        for key, value in checked_source_keys(self).items():
            object.__setattr__(self, key, value)
        check = SOURCES[self.dataset].check
        if check is not None:
            check(self)

    def load(self, data_dir: str | Path | None = None) -> Splits:
        """The examples, as their source gives them, for a loop of one's own
        (`Distributed.loader` reads them): `.train`, `.test`, and `.validation` where the
        source has one. `data_dir`: where MNIST's files are (default: the cache)."""
        return load_from_source(self, None if data_dir is None else Path(data_dir))


@dataclass(frozen=True)
class Optimizer(Settings):
    """The optimizer. For `sgd`, `adam` and `rmsprop`, `weight_decay` is an L2 term added to the
    gradient (torch's meaning); `adamw` decays decoupled. `nesterov`: sgd's Nesterov momentum.
    `weight_decay_exclude`: words that keep a parameter from weight decay where its name or its
    layer's type holds one, in any case (["bias", "norm"]: biases and normalisation layers).
    `gradient_clip_norm` 0 turns clipping off.

    A Python recipe may instead give `function`, which makes the framework's own optimizer
    (`Recipe(optimizer=function)` says the same): under torch `(module) -> torch.optim.Optimizer`
    over every trainable parameter, in groups of their own learning rates if it likes; under
    TensorFlow `() -> keras.optimizers.Optimizer` (a recipe with both models: `(model=None)`).
    Its learning rate (its first group's) is the one-process rate the schedule scales and warms
    up; each group keeps its ratio to it. Only `gradient_clip_norm` applies beside it."""

    section = "optimizer"
    name: str = setting("adam", kind=str, choices=OPTIMIZERS)
    learning_rate: float = setting(0.001, kind=float, positive=True)  # for one process
    momentum: float = setting(0.0, kind=float, minimum=0.0, below=1.0)
    nesterov: bool = setting(False, kind=bool)
    weight_decay: float = setting(0.0, kind=float, minimum=0.0)
    weight_decay_exclude: tuple[str, ...] = ()
    gradient_clip_norm: float = setting(0.0, kind=float, minimum=0.0)
    function: Callable[..., Any] | None = None  # a Python recipe's own optimizer

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.function is not None:
            self._check_function()
        words = self.weight_decay_exclude
        if not (isinstance(words, list | tuple) and all(type(w) is str and w for w in words)):
            example = 'like ["bias", "norm"]'
            raise self.fail("weight_decay_exclude", f"expected a list of words, {example}")
        object.__setattr__(self, "weight_decay_exclude", tuple(words))
        self.check_read()
        if self.nesterov and self.momentum == 0:
            raise self.fail(
                "nesterov",
                "Nesterov momentum needs a momentum above 0; set optimizer.momentum (0.9 is "
                "usual), or leave nesterov out",
            )

    def _check_function(self) -> None:
        if not callable(self.function):
            raise self.fail("function", f"expected a function making the optimizer, got "
                                        f"{self.function!r}")  # fmt: skip
        defaults = Optimizer()
        for key in ("name", "learning_rate", "momentum", "nesterov", "weight_decay",
                    "weight_decay_exclude"):  # fmt: skip
            if getattr(self, key) != getattr(defaults, key):
                raise self.fail(
                    key,
                    "the optimizer is made by optimizer.function; give this setting to the "
                    "optimizer it makes (only gradient_clip_norm applies beside it)",
                )

    def table(self) -> dict[str, Any]:
        """As every table's; with `function`, it by its name and the clipping alone."""
        if self.function is None:
            return super().table()
        return {"function": f"{PYTHON_FUNCTION}{function_name(self.function)}",
                "gradient_clip_norm": self.gradient_clip_norm}  # fmt: skip

    @property
    def coupled_weight_decay(self) -> float:
        """The weight decay added to the gradient as an L2 term: sgd's, adam's and rmsprop's
        (torch's meaning); none for adamw, which decays the weights decoupled."""
        return 0.0 if self.name == "adamw" else self.weight_decay

    def decays(self, name: str, layer_type: str) -> bool:
        """Whether weight decay applies to the parameter `name` of a layer of `layer_type`."""
        text = f"{name} {layer_type}".lower()
        return not any(word.lower() in text for word in self.weight_decay_exclude)


@dataclass(frozen=True)
class Schedule(Settings):
    """Epochs, the per-rank batch, the learning rate over time (scaled with the world size,
    warmed up linearly from the one-process rate, then decayed), and the passes' precision."""

    section = "schedule"
    epochs: int = setting(1, kind=int, positive=True)
    batch_size: int = setting(64, kind=int, positive=True)  # per rank
    lr_scaling: str = setting("linear", kind=str, choices=LR_SCALING)
    warmup_epochs: float = setting(0.0, kind=float, minimum=0.0)
    decay: Any = "none"  # a name, a table or a function: hvd_train/recipe/learning_rate.py
    # Mixed precision: the passes compute in bf16 or fp16, the weights stay fp32.
    precision: str = setting("fp32", kind=str, choices=PRECISIONS)
    evaluate_every: int = setting(0, kind=int, minimum=0)  # steps; 0: at each epoch's end
    early_stopping: Any = None  # a table: EARLY_STOPPING's keys

    def __post_init__(self) -> None:
        super().__post_init__()
        parse_decay(self.decay)
        if self.early_stopping is not None:
            object.__setattr__(self, "early_stopping", self._checked_early_stopping())

    def _checked_early_stopping(self) -> dict[str, Any]:
        """The early-stopping table with its defaults filled in; which figures it may monitor
        is the recipe's to check (it knows the metrics and the validation split)."""
        table = self.early_stopping
        example = '{ monitor = "val_loss", patience = 3 }'
        if not isinstance(table, dict):
            raise self.fail("early_stopping", f"expected a table, like {example}")
        unknown = sorted(set(table) - set(EARLY_STOPPING))
        if unknown:
            keys = ", ".join(EARLY_STOPPING)
            raise self.fail(f"early_stopping.{unknown[0]}", f"unknown key; use {keys}")
        checked = dict(EARLY_STOPPING) | table
        rules = {"monitor": Rule(kind=str), "patience": Rule(kind=int, positive=True),
                 "mode": Rule(kind=str, choices=("min", "max")),
                 "min_delta": Rule(kind=float, minimum=0.0)}  # fmt: skip
        return {key: rules[key].check(f"schedule.early_stopping.{key}", value)
                for key, value in checked.items()}  # fmt: skip

    def table(self) -> dict[str, Any]:
        """As every table's, with a Python recipe's own decay function by its name."""
        table = super().table()
        if callable(self.decay):
            table["decay"] = f"{PYTHON_FUNCTION}{function_name(self.decay)}"
        return table


@dataclass(frozen=True)
class ExchangeSettings(Settings):
    """The `[horovod]` table: how the ranks exchange the gradients and share out the training
    state, from the recipe to the backend's exchange unchanged. Gradients travel as they are,
    or as fp16 or bf16 (`compression`); after how many local backward passes; in buckets while
    the last backward pass goes on (`overlap = true`), in one group after it (`false`), or as
    hvd_train measures best (`"auto"`, see docs/performance.md); and each rank keeps what
    `shard` says of the optimizer's state and the averaged gradients (docs/sharding.md)."""

    section = "horovod"
    compression: str = setting("none", kind=str, choices=COMPRESSIONS)
    backward_passes_per_step: int = setting(1, kind=int, positive=True)
    overlap: bool | str = "auto"
    shard: str = setting("none", kind=str, choices=SHARDS)

    def __post_init__(self) -> None:
        super().__post_init__()
        if not (isinstance(self.overlap, bool) or self.overlap == "auto"):
            choices = 'choose true, false or "auto"'
            raise self.fail("overlap", f"unknown value {self.overlap!r}; {choices}")

    def unsharded(self) -> ExchangeSettings:
        """These settings with every rank holding the whole state (what evaluating and
        exporting, which step nothing, set up)."""
        return dataclasses.replace(self, shard="none")


@dataclass(frozen=True)
class Loading(Settings):
    """How the training batches are read, for any data (a Python recipe's own too); its keys
    sit in `[data]`. `workers` threads take the next batches while the step runs, up to
    `prefetch` batches ahead; 0 workers take each batch in the step. `"auto"`: none for arrays
    in memory, else one per core of the rank (2 to 8). A batch the workers have not read after
    `timeout` seconds stops the run (a source that hangs). What a batch holds never changes.
    `validation_fraction`: the share of the training examples set aside, drawn with the seed
    (the same on every rank and at any world size), as the validation split that each
    evaluation measures; the test set is then evaluated once, at the end."""

    section = "data"
    workers: int | str = "auto"
    prefetch: int = setting(2, kind=int, positive=True)
    timeout: float = setting(DEFAULT_TIMEOUT, kind=float, positive=True)
    validation_fraction: float = setting(0.0, kind=float, minimum=0.0, below=1.0)

    def __post_init__(self) -> None:
        super().__post_init__()
        workers = self.workers
        if not (workers == "auto" or (type(workers) is int and workers >= 0)):
            raise self.fail(
                "workers",
                f"unknown value {workers!r}; give a number of threads (0: read in the step) "
                'or "auto"',
            )
        self.check_read()


@dataclass(frozen=True)
class Checkpoints(Settings):
    """Besides the newest checkpoints (`--keep-checkpoints`), the `keep_best` best by the
    validation figure `monitor` (lowest with mode "min", highest with "max"), in the run's
    `best/` folder: each evaluation that ranks among them is saved there."""

    section = "checkpoints"
    keep_best: int = setting(0, kind=int, minimum=0)
    monitor: str = setting("val_loss", kind=str)
    mode: str = setting("min", kind=str, choices=("min", "max"))

    def __post_init__(self) -> None:
        super().__post_init__()
        self.check_read()


def checked_trackers(names: Any, given_as: str) -> tuple[str, ...]:
    """Trackers' names (`--track`'s, or the recipe's `output.trackers`), each known and its
    library installed; `given_as` names where they were given."""
    names = (names,) if isinstance(names, str) else tuple(names or ())
    for name in names:
        if name not in TRACKERS:
            raise UsageError(
                f"{given_as}: unknown tracker {name!r}; choose from {', '.join(TRACKERS)}"
            )
        if name != "csv" and importlib.util.find_spec(name) is None:
            raise UsageError(
                f"{given_as}: the {name} tracker needs the {name} package, which is not "
                f"installed; pip install 'hvd_train[{name}]'"
            )
    return tuple(dict.fromkeys(names))


@dataclass(frozen=True)
class Output(Settings):
    """Where the records go besides metrics.jsonl and TensorBoard: `trackers` (as `--track`
    names them, which adds to them). They do not change what trains, so a resumed run may
    change them, and the recipe's hash leaves them out."""

    section = "output"
    trackers: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "trackers", checked_trackers(self.trackers, "output.trackers"))


@dataclass(frozen=True)
class ReadWhen:
    """A setting that only some choices read: `reads` tells from its table whether one of them
    is chosen, `reader` names them for the message."""

    reads: Callable[[Any], bool]
    reader: str


# The settings that only some choices read, by table, in one place: a value other than the
# key's default where none of its readers is chosen would do nothing, so it is refused by name,
# from the recipe, `--set` and Python tables alike. (A source's `[data]` keys have their own
# table, data/sources.py; a decay's parameters theirs, recipe/learning_rate.py.)
READ_ONLY_WHEN: dict[str, dict[str, ReadWhen]] = {
    "Optimizer": {
        "momentum": ReadWhen(
            lambda o: o.name in ("sgd", "rmsprop"), 'optimizer.name = "sgd" or "rmsprop"'
        ),
        "nesterov": ReadWhen(lambda o: o.name == "sgd", 'optimizer.name = "sgd"'),
        "weight_decay_exclude": ReadWhen(
            lambda o: o.weight_decay > 0, "optimizer.weight_decay above 0"
        ),
    },
    "Loading": {
        "prefetch": ReadWhen(lambda d: d.workers != 0, "data.workers other than 0"),
        "timeout": ReadWhen(lambda d: d.workers != 0, "data.workers other than 0"),
    },
    "Checkpoints": {
        "monitor": ReadWhen(lambda c: c.keep_best > 0, "checkpoints.keep_best above 0"),
        "mode": ReadWhen(lambda c: c.keep_best > 0, "checkpoints.keep_best above 0"),
    },
}


def _default(cls: type[Settings], key: str) -> Any:
    (item,) = (item for item in dataclasses.fields(cls) if item.name == key)  # type: ignore[arg-type]
    return item.default


# Every key's section, so an override may name a key alone (`epochs=2`): the names are unique.
KEY_SECTIONS = {
    item.name: cls.section
    for cls in (Data, Loading, Optimizer, Schedule, ExchangeSettings, Checkpoints, Output)
    for item in dataclasses.fields(cls)
}
LOADING_KEYS = frozenset(item.name for item in dataclasses.fields(Loading))


def make_settings(cls: type[Settings], table: dict[str, Any]) -> Any:
    """`cls` made from a TOML table or overrides: unknown keys are refused by name."""
    if cls is ExchangeSettings and "fp16_compression" in table:
        table = read_fp16_compression(table)
    known = {item.name for item in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(table) - known)
    if unknown:
        raise UsageError(
            f"{cls.section}.{unknown[0]}: unknown key; check its spelling against the "
            "recipe reference (docs/recipes.md)"
        )
    if cls is Data and "dataset" not in table:
        raise UsageError("data.dataset: missing; add it to the recipe")
    return cls(**table)


# Keys of earlier versions and what replaced them, for the message that refuses them.
RENAMED = {"fp16_compression": 'horovod.compression="fp16"'}


def read_fp16_compression(table: dict[str, Any]) -> dict[str, Any]:
    """A `[horovod]` table from before `compression` (a recipe, or a checkpoint's saved one):
    its `fp16_compression = true` or `false` read as `compression = "fp16"` or `"none"`."""
    table = dict(table)
    old = table.pop("fp16_compression")
    if "compression" in table:
        raise UsageError("horovod.fp16_compression: replaced by horovod.compression, which is "
                         "given too; remove fp16_compression")  # fmt: skip
    if not isinstance(old, bool):
        raise UsageError(f"horovod.fp16_compression: expected true or false, got {old!r}; "
                         'better, use compression = "none", "fp16" or "bf16"')  # fmt: skip
    return table | {"compression": "fp16" if old else "none"}
