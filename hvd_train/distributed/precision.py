"""What a model's passes compute in: one of the recipe's precisions, checked once, and what
follows from it for the backend that runs them."""

from __future__ import annotations

from dataclasses import dataclass

from hvd_train.recipe.rules import Rule
from hvd_train.recipe.settings import LOSS_SCALED, PRECISIONS


@dataclass(frozen=True)
class Precision:
    """`name`: "fp32", "bf16-mixed" or "fp16-mixed": the passes compute in bf16 or fp16 where
    mixed, the weights stay fp32, and fp16's loss is scaled so that small gradients do not
    vanish."""

    name: str = "fp32"

    def __post_init__(self) -> None:
        Rule(kind=str, choices=PRECISIONS).check("precision", self.name)

    @property
    def mixed(self) -> str | None:
        """The mixed precision a backend starts in (Keras's policy for the models built from
        then on), None for fp32."""
        return None if self.name == "fp32" else self.name

    @property
    def scales_loss(self) -> bool:
        """Whether the loss is scaled before its backward pass (fp16-mixed)."""
        return self.name == LOSS_SCALED
