"""A step as one TensorFlow graph for every batch size."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import tensorflow as tf

from hvd_train.data.base import MASK
from hvd_train.errors import UsageError


class Compiled:
    """`function` as one TensorFlow graph for every batch size: its first call traces it with
    the batch dimension of its first `batch_arguments` arguments left open, so that an epoch's
    last, smaller batch does not trace it again. Traced without AutoGraph, as Keras 3 traces
    its own train step: nothing here branches on a tensor, and AutoGraph's rewrite of Horovod's
    `grouped_allreduce` took most of the first step's time (docs/history.md, "Speed")."""

    def __init__(self, function: Callable[..., Any], batch_arguments: int) -> None:
        self.graph = tf.function(function, reduce_retracing=True, autograph=False)
        self.batch_arguments = batch_arguments
        self.traced = False

    def __call__(self, *arguments: Any) -> Any:
        if not self.traced:
            batch = arguments[: self.batch_arguments]  # arrays, dicts, tuples (labels)
            specs = tf.nest.map_structure(_open_batch, batch)
            for part, spec in zip(batch, specs, strict=True):
                if isinstance(part, dict):  # sequences and their masks: any length too
                    for name in [name for name in part if MASK.format(name) in part]:
                        for key in (name, MASK.format(name)):
                            shape = [None, None, *np.shape(part[key])[2:]]
                            spec[key] = tf.TensorSpec(shape, tf.as_dtype(part[key].dtype))
            try:
                self.graph.get_concrete_function(*specs, *arguments[self.batch_arguments :])
            except tf.errors.OperatorNotAllowedInGraphError as error:
                raise UsageError(
                    "the model or the loss uses a tensor as a Python bool (if, while, and, or), "
                    "which a graph traced without AutoGraph cannot hold (as in Keras 3's fit); "
                    "branch with keras.ops.cond or tf.cond (--debug shows where)"
                ) from error
            self.traced = True
        return self.graph(*arguments)


def _open_batch(array: np.ndarray) -> tf.TensorSpec:
    """`array`'s spec, with any batch size."""
    return tf.TensorSpec([None, *np.shape(array)[1:]], tf.as_dtype(array.dtype))
