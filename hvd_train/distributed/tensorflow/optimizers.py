"""The Keras optimizer a model trains with under TensorFlow: the one a loop brings (checked), or
one made from a recipe's `Optimizer` table, with torch's meaning of its settings."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import keras

from hvd_train.errors import UsageError
from hvd_train.recipe.settings import EPSILON, RMSPROP_DECAY, Optimizer, function_name


def made_optimizer(given: Any) -> keras.optimizers.Optimizer:
    """`given` itself (a Keras optimizer), or one made from a recipe's `Optimizer` table (by
    its `function`, for a recipe's own)."""
    if isinstance(given, Optimizer):
        return _optimizer(given) if given.function is None else _own_optimizer(given.function)
    if isinstance(given, keras.optimizers.LossScaleOptimizer):
        raise UsageError(
            "setup: the optimizer is wrapped in a LossScaleOptimizer; give the inner one, and "
            'Distributed(precision="fp16-mixed") wraps it itself'
        )
    if not isinstance(given, keras.optimizers.Optimizer):
        raise UsageError(
            f"setup: the optimizer is a {type(given).__module__}.{type(given).__name__}, and this "
            "job runs TensorFlow; give a Keras optimizer (keras.optimizers.Adam(...), ...) or "
            "hvd_train.Optimizer(...)"
        )
    return given


def _optimizer(config: Optimizer) -> keras.optimizers.Optimizer:
    """The recipe's optimizer with torch's meaning of its settings, where Keras differs (the L2
    term of `coupled_weight_decay` is added to the gradients by the step)."""
    lr = config.learning_rate
    if config.name == "sgd":
        return keras.optimizers.SGD(lr, momentum=config.momentum, nesterov=config.nesterov)
    if config.name == "rmsprop":
        # torch divides by sqrt(v) + EPSILON, Keras by sqrt(v + epsilon): alike at v = 0, and
        # within EPSILON of each other beyond.
        return keras.optimizers.RMSprop(lr, rho=RMSPROP_DECAY, momentum=config.momentum,
                                        epsilon=EPSILON**2)  # fmt: skip
    if config.name == "adam":
        return keras.optimizers.Adam(lr, epsilon=EPSILON)
    return keras.optimizers.AdamW(lr, weight_decay=config.weight_decay, epsilon=EPSILON)


def _own_optimizer(function: Callable[..., Any]) -> keras.optimizers.Optimizer:
    """The optimizer a Python recipe's `optimizer.function` makes, checked: a Keras optimizer
    whose learning rate is a number, which the schedule then sets each step."""
    name = function_name(function)
    made = function()
    if not isinstance(made, keras.optimizers.Optimizer) or isinstance(
        made, keras.optimizers.LossScaleOptimizer
    ):
        raise UsageError(
            f"optimizer.function ({name}) returned {type(made).__name__}; under TensorFlow it "
            "must return a Keras optimizer (keras.optimizers.Adam(...), ...), not wrapped: "
            "fp16-mixed wraps it itself"
        )
    if has_schedule(made):
        raise UsageError(
            f"optimizer.function ({name}): its optimizer has a learning rate schedule; give it "
            "a number, and the schedule to the recipe's Schedule(warmup_epochs=..., decay=...)"
        )
    return made


def has_schedule(optimizer: keras.optimizers.Optimizer) -> bool:
    """Whether `optimizer`'s learning rate is a schedule, not a number."""
    schedule = keras.optimizers.schedules.LearningRateSchedule
    return isinstance(optimizer._learning_rate, schedule)
