"""Per-example transforms of the training inputs: the recipe's `[data] transforms` list, or a
Python recipe's `transform=(x, rng) -> x`. They run where the batch is taken (in the data
workers). Each example's random numbers come from (seed, epoch, example index), so an example is
augmented alike at any world size and with any workers, and a resumed run draws what the
uninterrupted one drew. Evaluation takes the deterministic entries only (`normalize`,
`resize`), in their order: random crops and flips are for training.

An example's input is one image (height, width, channels), float32.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from hvd_train.errors import UsageError

# An example's input, and its generator (None for the deterministic ones) -> the input.
Transform = Callable[[np.ndarray, Any], np.ndarray]


def random_crop(padding: int) -> Transform:
    """Pads `padding` zeros on every side, then crops the image's size at a random place."""

    def crop(x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        height, width = x.shape[:2]
        padded = np.pad(x, ((padding, padding), (padding, padding), (0, 0)))
        top, left = rng.integers(0, 2 * padding + 1, size=2)
        return padded[top : top + height, left : left + width]

    return crop


def horizontal_flip(probability: float) -> Transform:
    if probability > 1:
        raise UsageError(f"probability {probability} is above 1")

    def flip(x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        return x[:, ::-1] if rng.random() < probability else x

    return flip


def normalize(mean: Sequence[float], std: Sequence[float]) -> Transform:
    if len(mean) != len(std) or min(std) <= 0:
        raise UsageError("give mean and std as lists of one number per channel, std above 0")
    mean_, std_ = np.asarray(mean, np.float32), np.asarray(std, np.float32)
    return lambda x, rng: (x - mean_) / std_


def resize(height: int, width: int) -> Transform:
    """Bilinear, channel by channel (Pillow's float images); an image, or a batch of them."""

    def resized(x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        from PIL import Image

        if x.ndim == 4:
            return np.stack([resized(image, rng) for image in x])

        channels = [
            np.asarray(
                Image.fromarray(x[..., c]).resize((width, height), Image.Resampling.BILINEAR)
            )
            for c in range(x.shape[2])
        ]
        return np.stack(channels, axis=-1)

    return resized


# type: (function, its parameters with their kinds, whether it draws random numbers)
KINDS: dict[str, tuple[Callable[..., Transform], dict[str, type], bool]] = {
    "random_crop": (random_crop, {"padding": int}, True),
    "horizontal_flip": (horizontal_flip, {"probability": float}, True),
    "normalize": (normalize, {"mean": list, "std": list}, False),
    "resize": (resize, {"height": int, "width": int}, False),
}
DEFAULTS = {"horizontal_flip": {"probability": 0.5}}


@dataclass(frozen=True)
class Transforms:
    """The training transforms, and the deterministic ones evaluation takes too."""

    training: tuple[Transform, ...]
    evaluation: tuple[Transform, ...]

    @property
    def random(self) -> bool:
        """Whether a training transform draws random numbers."""
        return len(self.training) > len(self.evaluation)


def parse_transforms(entries: Sequence[Any]) -> Transforms:
    """`[data] transforms` checked: each entry a table with a known `type` and its parameters;
    a mistake is one UsageError naming the entry."""
    training, evaluation = [], []
    for index, entry in enumerate(entries):
        where = f"data.transforms[{index}]"
        if not isinstance(entry, dict) or entry.get("type") not in KINDS:
            raise UsageError(
                f"{where}: expected a table with type = one of {', '.join(KINDS)}, got {entry!r}"
            )
        make, kinds, random = KINDS[entry["type"]]
        given = {**DEFAULTS.get(entry["type"], {}), **entry}
        del given["type"]
        if set(given) != set(kinds):
            raise UsageError(f"{where}: {entry['type']} takes {', '.join(kinds)}; got {entry!r}")
        for name, kind in kinds.items():
            given[name] = _checked(f"{where}.{name}", kind, given[name])
        try:
            transform = make(**given)
        except UsageError as error:
            raise UsageError(f"{where}: {error}") from None
        training.append(transform)
        if not random:
            evaluation.append(transform)
    return Transforms(tuple(training), tuple(evaluation))


DESCRIBED = {int: "a positive integer", float: "a positive number",
             list: "a list of numbers, one per channel"}  # fmt: skip


def _checked(where: str, kind: type, value: Any) -> Any:
    if kind is list and isinstance(value, list) and value:
        if all(type(v) in (int, float) and np.isfinite(v) for v in value):
            return [float(v) for v in value]
    elif kind is float and type(value) in (int, float) and 0 < value < float("inf"):
        return float(value)
    elif kind is int and type(value) is int and value > 0:
        return value
    raise UsageError(f"{where}: expected {DESCRIBED[kind]}, got {value!r}")


def example_rng(seed: int, epoch: int, index: int) -> np.random.Generator:
    return np.random.default_rng([seed, epoch, index])


def apply(
    transforms: Sequence[Transform], x: Any, indices: np.ndarray, *, seed: int, epoch: int,
    random: bool = True,
) -> Any:  # fmt: skip
    """The batch `x` (examples `indices`) with each example transformed by its own numbers.
    Without `random`, the transforms are the deterministic built-ins, which take the whole
    batch at once (an example's generator, and a call per example, cost more than they do).
    Named inputs (a dict) are transformed an example's dict at a time, keeping their dtypes."""
    if not transforms:
        return x
    if not random and not isinstance(x, dict):
        for transform in transforms:
            x = transform(np.asarray(x, np.float32), None)
        return np.asarray(x, np.float32)
    named = isinstance(x, dict)
    examples = [{k: v[i] for k, v in x.items()} for i in range(len(indices))] if named else x
    transformed = []
    for example, index in zip(examples, indices, strict=True):
        rng = example_rng(seed, epoch, int(index)) if random else None
        for transform in transforms:
            example = transform(example, rng)
        transformed.append(example if named else np.asarray(example, np.float32))
    if named:
        return {name: np.stack([example[name] for example in transformed]) for name in x}
    return np.stack(transformed)


@dataclass(frozen=True)
class Transformed:
    """A dataset whose inputs pass through deterministic transforms (evaluation's)."""

    dataset: Any
    transforms: tuple[Transform, ...]

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, indices: np.ndarray) -> tuple[Any, Any]:
        x, y = self.dataset[indices]
        x = np.asarray(x, np.float32)
        return apply(self.transforms, x, indices, seed=0, epoch=0, random=False), y
