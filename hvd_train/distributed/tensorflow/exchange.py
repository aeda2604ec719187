"""The gradients' exchange under TensorFlow, and the Keras optimizer that `setup` makes
distributed.

Horovod 0.28.1's Keras integration targets Keras 2: with Keras 3 its `DistributedGradientTape`
and `broadcast_variables` fail on Keras variables (the patch series mends them for scripts that
use them), and its Keras `DistributedOptimizer` lets `model.fit` apply gradients never averaged.
So the layer averages with Horovod's TensorFlow ops itself: a grouped allreduce per bucket of
gradients, inside the step's graph, where each starts as soon as its gradients are made.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import horovod.tensorflow as hvd
import keras
import numpy as np
import tensorflow as tf

from hvd_train.distributed.overlap import buckets

if TYPE_CHECKING:
    from hvd_train.distributed.tensorflow.sharding import KerasShards

# The dtype each `[horovod] compression` sends gradients as (None: as they are).
TRAVEL_DTYPES = {"none": None, "fp16": tf.float16, "bf16": tf.bfloat16}


class Cast:
    """Horovod's compressor interface: gradients cast to `dtype` to travel and back to their
    own after, as Horovod's fp16 compressor does for float16; `None` sends them as they are."""

    def __init__(self, dtype: tf.DType | None) -> None:
        self.dtype = dtype

    def compress(self, tensor: tf.Tensor) -> tuple[tf.Tensor, tf.DType | None]:
        if self.dtype is None:
            return tensor, None
        return tf.cast(tensor, self.dtype), tensor.dtype

    def decompress(self, tensor: tf.Tensor, own: tf.DType | None) -> tf.Tensor:
        return tensor if own is None else tf.cast(tensor, own)


def dense(gradients: list[Any], variables: list[Any]) -> tuple[list[tf.Tensor], list[bool]]:
    """The `gradients` of `variables` as dense tensors (an embedding's IndexedSlices made dense,
    as torch's are: Horovod's sparse_as_dense), zeros for a variable with none (no pass reached
    it: another rank may have one); and which had one (`reached`)."""
    reached = [gradient is not None for gradient in gradients]
    tensors = [zeros_from(v.value, v.shape) if g is None else tf.convert_to_tensor(g)
               for g, v in zip(gradients, variables, strict=True)]  # fmt: skip
    return tensors, reached


def zeros_from(tensor: tf.Tensor, shape: Any) -> tf.Tensor:
    """Zeros of `shape` in `tensor`'s dtype, made from `tensor` (so, not a constant: a
    collective must not send one, which TensorFlow's graph optimizer would run a Horovod op on
    before the step, alone), keeping none of it (an empty slice would share its buffer, and
    keep it until the slice is let go)."""
    return tf.zeros(shape, tensor.dtype) + tf.reduce_sum(tf.reshape(tensor, [-1])[:0])


def reached_only(gradients: list[tf.Tensor], reached: list[bool]) -> list[tf.Tensor | None]:
    """`gradients` with None for the variables no pass reached: Keras's optimizer skips those,
    as it skips them in a step of one process (no weight decay, no momentum)."""
    return [g if r else None for g, r in zip(gradients, reached, strict=True)]


def agreeing(averaged: tf.Tensor, reached: list[bool]) -> None:
    """Fails the step where the ranks' `reached` differ (their `averaged` 0/1 flags are not
    this rank's): which variables a step reaches is fixed when TensorFlow traces it, so a
    rank cannot learn another's, and updating some variables on some ranks only would part
    the replicas."""
    tf.debugging.assert_equal(
        averaged, tf.cast(reached, averaged.dtype),
        message="a variable has a gradient on some ranks and none on others (a step whose "
        "graph differs by rank): make every rank's step reach the same variables",
    )  # fmt: skip


class GroupedExchange:
    """How the gradients of `variables` travel: cast by `compression`, in `buckets` (the order
    the backward pass makes them) or in one group, and clipped to `clip_norm` after averaging.
    For a loop's own optimizer also: its `passes` backward passes a step, added up locally
    first."""

    def __init__(self, variables: list[Any], compression: str, passes: int, overlap: bool | str,
                 clip_norm: float, world_size: int) -> None:  # fmt: skip
        self.compression = Cast(TRAVEL_DTYPES[compression])
        sizes = [np.dtype(v.dtype).itemsize * int(np.prod(v.shape)) for v in variables]
        self.buckets = buckets(sizes)
        self.clip_norm, self.passes, self.world_size = clip_norm, passes, world_size
        # A loop's own traced step cannot change how it groups the gradients once traced: it
        # sends buckets wherever there are several, unless overlap is off.
        self.groups = self.buckets if overlap is not False else [list(range(len(variables)))]
        self.totals = [tf.Variable(tf.zeros_like(v), trainable=False)
                       for v in variables if passes > 1]  # fmt: skip
        self.count = tf.Variable(0, trainable=False, dtype=tf.int64)
        # With `[horovod] shard`, this rank's part of the training state (set by the backend).
        self.shards: KerasShards | None = None

    def average(
        self, gradients: list[tf.Tensor], control: tf.Tensor | None, groups: list[list[int]],
        reached: list[bool],
    ) -> tuple[list[tf.Tensor], tf.Tensor | None]:  # fmt: skip
        """The gradients averaged over the ranks in one grouped allreduce per group (one
        negotiation each), the `control` values in the last, and which variables each rank's
        step `reached` (the ranks must agree: `agreeing`). Horovod's grouped op takes one
        dtype, so under compression the control values, which travel at full precision, take
        an allreduce of their own. Alone, nothing travels. Sharded, each bucket is
        reduce-scattered instead, and this rank's pieces of the averages come back
        (`KerasShards.cut`'s)."""
        if self.world_size == 1:
            return gradients, control
        # 0/1 per variable, made from a gradient, not a constant (`zeros_from`).
        dtype = tf.float32 if self.shards is not None else gradients[groups[-1][0]].dtype
        flags = tf.cast(reached, dtype) + tf.cast(zeros_from(gradients[0], [len(reached)]), dtype)
        if self.shards is not None:
            if control is not None:
                flags = tf.concat([control, flags], 0)
            agreed = hvd.allreduce(flags, op=hvd.Average, name="hvd_train.control")
            agreeing(agreed[-len(reached) :], reached)
            control = None if control is None else agreed[: -len(reached)]
            return self.shards.scatter(gradients), control
        averaged = list(gradients)
        with_control = control is not None and self.compression.dtype is None
        with tf.name_scope("hvd_train.step"):
            for number, group in enumerate(groups):
                tensors = [gradients[index] for index in group]
                if number == len(groups) - 1:
                    tensors += [flags, control] if with_control else [flags]
                sums = hvd.grouped_allreduce(tensors, op=hvd.Average,
                                             compression=self.compression)  # fmt: skip
                for index, tensor in zip(group, sums, strict=False):
                    averaged[index] = tensor
            agreeing(sums[len(groups[-1])], reached)
            if with_control:
                control = sums[-1]
            elif control is not None:
                control = hvd.allreduce(control, op=hvd.Average, name="hvd_train.control")
        return averaged, control

    def clipped(self, gradients: list[tf.Tensor], scale: Any) -> tuple[list[tf.Tensor], tf.Tensor]:
        """The averaged gradients clipped to `clip_norm`, and their norm before clipping; under
        fp16-mixed they are still multiplied by the loss `scale`. Sharded, this rank's pieces
        of them (`KerasShards.cut`'s), and the norm over every rank's."""
        if self.shards is not None:
            norm = self.shards.norm(gradients) / scale
        else:
            norm = tf.linalg.global_norm(gradients) / scale
        if self.clip_norm:
            gradients, _ = tf.clip_by_global_norm(gradients, self.clip_norm * scale,
                                                  use_norm=norm * scale)  # fmt: skip
        return gradients, norm

    def values(self, variables: list[Any]) -> list[Any]:
        """The `variables`' values as `clipped` gives their gradients: whole, or, sharded, this
        rank's pieces."""
        if self.shards is not None:
            return self.shards.cut([v.value for v in variables])
        return variables

    def apply(self, optimizer: Any, gradients: list[tf.Tensor], variables: list[Any],
              norm: tf.Tensor, reached: list[bool]) -> Any:  # fmt: skip
        """The optimizer's own update with the averaged (and clipped) `gradients`, of the
        `variables` its step `reached` (`reached_only`), or, sharded, of this rank's pieces of
        them, which then reach every rank; `norm`: the gradients' norm, finite where no rank's
        part overflowed."""
        if self.shards is None:
            return optimizer.apply_own(reached_only(gradients, reached), variables)
        return self.shards.apply(optimizer, gradients, reached, tf.math.is_finite(norm))


def loss_scale(optimizer: keras.optimizers.Optimizer) -> Any:
    """What the gradients are multiplied by: the loss scale under fp16-mixed, else 1."""
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        return optimizer.dynamic_scale
    return 1.0


class DistributedKerasOptimizer:
    """Mixed into the class of the Keras optimizer `setup` takes (`distribute`): its `apply`
    (which `apply_gradients` and `model.fit` call) averages the gradients over the ranks and
    clips them before the optimizer's own; with `passes` above 1 it adds them up locally and
    applies their sum every `passes`-th call, as torch's .grad adds the passes up (divide each
    pass's loss by `passes` for their mean). The optimizer stays the same object."""

    _exchange: GroupedExchange
    # Sharded, whether every rank's part of the gradients was finite: what a LossScaleOptimizer
    # checks, where its own check would see this rank's part only.
    agreed_finite: tf.Tensor | None = None

    def apply(self, grads: Any, trainable_variables: Any = None) -> Any:
        if trainable_variables is None:  # Keras's apply takes those it was built over
            trainable_variables = self._trainable_variables  # type: ignore[attr-defined]
        gradients, reached = dense(list(grads), list(trainable_variables))
        exchange = self._exchange
        if exchange.passes == 1:
            return self._averaged_apply(gradients, trainable_variables, reached)
        for total, gradient in zip(exchange.totals, gradients, strict=True):
            total.assign_add(gradient)
        due = exchange.count.assign_add(1) % exchange.passes == 0

        def apply_sum() -> tf.Tensor:
            self._averaged_apply([tf.identity(total) for total in exchange.totals],
                                 trainable_variables, reached)  # fmt: skip
            for total in exchange.totals:
                total.assign(tf.zeros_like(total))
            return tf.constant(True)

        return tf.cond(due, apply_sum, lambda: tf.constant(False))

    def _averaged_apply(self, gradients: list[tf.Tensor], trainable_variables: Any,
                        reached: list[bool]) -> Any:  # fmt: skip
        exchange = self._exchange
        averaged, _ = exchange.average(gradients, None, exchange.groups, reached)
        clipped, norm = exchange.clipped(averaged, loss_scale(self))
        return exchange.apply(self, clipped, trainable_variables, norm, reached)

    def _all_reduce_sum_gradients(self, grads_and_vars: Any) -> Any:
        """Keras's sum over tf.distribute's replicas, here none (Horovod averaged the
        gradients): its identity under the default strategy joins every gradient, so each
        variable's update would wait for the last bucket's average, and, sharded, so would
        every bucket's allgather (docs/history.md, "TensorFlow's update in the backward
        pass")."""
        return grads_and_vars

    def apply_own(self, grads: Any, trainable_variables: Any = None) -> Any:
        """The optimizer's own apply: gradients already averaged."""
        return super().apply(grads, trainable_variables)  # type: ignore[misc]

    def check_finite(self, grads: Any) -> Any:
        """A LossScaleOptimizer's check: sharded, every rank's part's (`agreed_finite`)."""
        if self.agreed_finite is not None:
            return self.agreed_finite
        return super().check_finite(grads)  # type: ignore[misc]


def distribute(optimizer: keras.optimizers.Optimizer, exchange: GroupedExchange) -> None:
    """Makes `optimizer` a `DistributedKerasOptimizer`, averaging as `exchange` says."""
    own = type(optimizer)
    optimizer.__class__ = type(own.__name__, (DistributedKerasOptimizer, own), {})
    optimizer._exchange = exchange
