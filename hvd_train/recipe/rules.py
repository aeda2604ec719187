"""What a setting accepts: its type, range or choices, checked the same way everywhere."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, cast

from hvd_train.errors import UsageError


@dataclass(frozen=True)
class Rule:
    """What one key accepts."""

    kind: type
    minimum: float | None = None  # inclusive
    below: float | None = None  # exclusive upper bound
    positive: bool = False
    choices: tuple[str, ...] = ()

    def check(self, where: str, given: Any) -> Any:
        """`given` if it obeys the rule (ints widened to float where a float is asked for)."""
        value: Any = given
        if self.kind is float and type(value) is int:
            value = float(value)
        if type(value) is not self.kind:
            raise UsageError(f"{where}: expected {self.kind.__name__}, got {value!r}")
        value = cast(Any, value)  # of the rule's kind from here on
        if self.kind is float and not math.isfinite(value):
            raise UsageError(f"{where}: {value!r} is not a finite number; give a finite value")
        if self.positive and value <= 0:
            raise UsageError(f"{where}: {value!r} is out of range; it must be positive")
        if self.minimum is not None and value < self.minimum:
            raise UsageError(
                f"{where}: {value!r} is out of range; it must be at least {self.minimum}"
            )
        if self.below is not None and not value < self.below:
            raise UsageError(f"{where}: {value!r} is out of range; it must be below {self.below}")
        if self.choices and value not in self.choices:
            raise UsageError(
                f"{where}: unknown value {value!r}; choose one of {', '.join(self.choices)}"
            )
        return value
