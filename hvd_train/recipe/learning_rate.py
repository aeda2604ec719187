"""The learning rate: scaled with the world size, warmed up, then decayed.

`[schedule] decay` is a name, a table `{ type = NAME, ... }` with the decay's parameters, or, in
a Python recipe, a function `(step, steps) -> factor` of the peak rate, where `step` counts the
optimizer steps since warmup ended (from 0) and `steps` is how many follow warmup:

- "none": the peak rate throughout;
- "cosine": half a cosine from the peak to zero at the last step;
- "linear": a straight line from the peak to zero; "polynomial": `(1 - progress) ** power`, from
  the peak to `end` x the peak (power 1, end 0: "linear");
- "exponential": x `gamma` every epoch after warmup, continuously;
- "step": x `gamma` (0.1) every `every` epochs, counted from the run's start (as torch's StepLR);
- "multistep": x `gamma` (0.1) at each of the `milestones`, epochs from the run's start;
- "one_cycle": torch's OneCycleLR over the steps after warmup: a cosine from the peak /
  `div_factor` (25) up to the peak over the first `pct_start` (0.3) of them, then down to the
  peak / (`div_factor` x `final_div_factor` (1e4)); it warms up by itself, so it is usually
  given no `warmup_epochs`.

Warmup (`warmup_epochs`) ramps from the one-process rate to the peak before any of them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from hvd_train.errors import UsageError
from hvd_train.recipe.rules import Rule

if TYPE_CHECKING:
    from hvd_train.recipe.settings import Schedule  # which imports parse_decay from here

EPOCHS = Rule(float, positive=True)
FACTOR = Rule(float, positive=True)
# Each decay's parameters: their rules and defaults (None: the decay needs it given).
PARAMETERS: dict[str, dict[str, tuple[Rule | None, Any]]] = {
    "none": {},
    "cosine": {},
    "linear": {},
    "polynomial": {"power": (FACTOR, 1.0), "end": (Rule(float, minimum=0.0, below=1.0), 0.0)},
    "exponential": {"gamma": (FACTOR, None)},
    "step": {"every": (EPOCHS, None), "gamma": (FACTOR, 0.1)},
    "multistep": {"milestones": (None, None), "gamma": (FACTOR, 0.1)},
    "one_cycle": {
        "pct_start": (Rule(float, positive=True, below=1.0), 0.3),
        "div_factor": (Rule(float, minimum=1.0), 25.0),
        "final_div_factor": (Rule(float, minimum=1.0), 1e4),
    },
}
DECAYS = tuple(PARAMETERS)


def scaling_factor(scale: int, rule: str) -> float:
    """What a one-process learning rate is multiplied by for a global batch `scale` times the
    one-process batch (world size x backward passes per step): the one rule of hvd_train's
    learning-rate scaling, a recipe's (`[schedule] lr_scaling`) and a loop's own
    (`setup(..., scale_learning_rate=...)`).

    "linear" follows Goyal et al. and Horovod's examples (the global batch grows with the world
    size and the passes, so does the step); "sqrt" is gentler, for adaptive optimizers at large
    scale.
    """
    return {"linear": float(scale), "sqrt": math.sqrt(scale), "none": 1.0}[rule]


def parse_decay(given: Any) -> tuple[str, dict[str, Any]]:
    """A decay's name and every parameter (defaults filled in), checked; a function is
    ("function", {}). A mistake is one UsageError naming the key."""
    if callable(given):
        return "function", {}
    table = {"type": given} if isinstance(given, str) else given
    if not isinstance(table, Mapping) or not isinstance(table.get("type"), str):
        raise UsageError(
            "schedule.decay: expected a name, a table { type = NAME, ... } or a function "
            f"(step, steps) -> factor, got {given!r}"
        )
    name = table["type"]
    if name not in PARAMETERS:
        choices = ", ".join(DECAYS)
        raise UsageError(f"schedule.decay: unknown type {name!r}; choose one of {choices}")
    expected = PARAMETERS[name]
    unknown = sorted(set(table) - {"type"} - set(expected))
    if unknown:
        known = ", ".join(expected) or "none"
        raise UsageError(f"schedule.decay: {name} takes no {unknown[0]!r}; its parameters: {known}")
    parameters = {}
    for key, (rule, default) in expected.items():
        where = f"schedule.decay.{key}"
        if key not in table:
            if default is None:
                example = f'{{ type = "{name}", {key} = ... }}'
                raise UsageError(f"{where}: {name} needs it; give {example}")
            parameters[key] = default
        elif rule is None:  # milestones
            parameters[key] = _milestones(table[key])
        else:
            parameters[key] = rule.check(where, table[key])
    return name, parameters


def _milestones(given: Any) -> tuple[float, ...]:
    if not isinstance(given, list | tuple) or not given:
        raise UsageError(
            f"schedule.decay.milestones: expected a list of epochs, like [30, 60], got {given!r}"
        )
    epochs = tuple(EPOCHS.check("schedule.decay.milestones", value) for value in given)
    if list(epochs) != sorted(set(epochs)):
        raise UsageError(
            f"schedule.decay.milestones: {list(given)} must rise; give each epoch once, in order"
        )
    return epochs


@dataclass(frozen=True)
class LearningRateSchedule:
    base: float  # the recipe's learning rate, where warmup starts
    peak: float  # the scaled learning rate, reached after warmup
    warmup_steps: int
    total_steps: int
    steps_per_epoch: int
    decay: str  # a name of DECAYS, or "function"
    parameters: Mapping[str, Any] = field(default_factory=dict)  # the decay's, filled in
    function: Callable[[int, int], float] | None = None  # a Python recipe's own decay

    @classmethod
    def from_recipe(
        cls, schedule: Schedule, base: float, scale: int, steps_per_epoch: int
    ) -> LearningRateSchedule:
        """The schedule in optimizer steps, for a global batch `scale` times the recipe's."""
        decay, parameters = parse_decay(schedule.decay)
        return cls(
            base=base,
            peak=base * scaling_factor(scale, schedule.lr_scaling),
            warmup_steps=round(schedule.warmup_epochs * steps_per_epoch),
            total_steps=schedule.epochs * steps_per_epoch,
            steps_per_epoch=steps_per_epoch,
            decay=decay,
            parameters=parameters,
            function=schedule.decay if decay == "function" else None,
        )

    def __call__(self, step: int) -> float:
        """The learning rate for global step `step` (0-based)."""
        if step < self.warmup_steps:
            return self.base + (self.peak - self.base) * step / self.warmup_steps
        return self.peak * self.factor(step)

    def factor(self, step: int) -> float:
        """The decay's factor of the peak rate at global step `step`, after warmup."""
        p = self.parameters
        after, steps = step - self.warmup_steps, max(1, self.total_steps - self.warmup_steps)
        progress, epoch = after / steps, step / self.steps_per_epoch
        match self.decay:
            case "function":
                assert self.function is not None
                return _checked_factor(self.function, after, steps, step)
            case "none":
                return 1.0
            case "cosine":
                return 0.5 * (1.0 + math.cos(math.pi * progress))
            case "linear" | "polynomial":
                power, end = p.get("power", 1.0), p.get("end", 0.0)
                return end + (1.0 - end) * max(0.0, 1.0 - progress) ** power
            case "exponential":
                return float(p["gamma"] ** (after / self.steps_per_epoch))
            case "step":  # a small margin: 0.3 epochs x 10 is 3, not 2.9999999999999996
                return float(p["gamma"] ** math.floor(epoch / p["every"] + 1e-9))
            case "multistep":
                return float(p["gamma"] ** sum(epoch >= m - 1e-9 for m in p["milestones"]))
        assert self.decay == "one_cycle"  # torch's OneCycleLR, its phases' ends as torch puts them
        start, low = 1.0 / p["div_factor"], 1.0 / (p["div_factor"] * p["final_div_factor"])
        peak_at, last = p["pct_start"] * steps - 1.0, steps - 1.0
        if peak_at > 0 and after <= peak_at:
            return _cosine_between(start, 1.0, after / peak_at)
        return _cosine_between(1.0, low, (after - max(peak_at, 0.0)) / max(1.0, last - peak_at))


def _cosine_between(begin: float, end: float, fraction: float) -> float:
    """Half a cosine from `begin` (fraction 0) to `end` (fraction 1)."""
    return end + (begin - end) * 0.5 * (1.0 + math.cos(math.pi * min(1.0, fraction)))


def _checked_factor(function: Callable[[int, int], float], after: int, steps: int,
                    step: int) -> float:  # fmt: skip
    """A recipe's own decay at `after` of `steps`: a finite factor >= 0, or one UsageError."""
    factor = function(after, steps)
    name = getattr(function, "__name__", repr(function))
    if (
        isinstance(factor, bool)
        or not isinstance(factor, int | float)
        or not (math.isfinite(factor) and factor >= 0)
    ):
        raise UsageError(
            f"schedule.decay: {name}({after}, {steps}) returned {factor!r} at step {step}; "
            "return a finite factor >= 0 of the peak learning rate"
        )
    return float(factor)
