"""ZeRO's sharding under TensorFlow, through Horovod's collectives (`[horovod] shard`).

Rank r holds the r-th of N cuts of each bucket (`hvd_train/distributed/sharding.py`). TensorFlow
has no views into a variable, so the cuts fall at the parameters' edges, and the optimizer is
built over the model's own variables that this rank holds, and an empty stand-in for each it
does not: its variables line up one for one with those an unsharded optimizer makes, each
holding this rank's part, and nothing is held twice. The exchange's buckets are joined until
their cuts come near even. Only a parameter too large to be held whole (over half a rank's
share, with an element-wise optimizer) is cut inside: this rank's run of it is a 1-D Keras
variable of its own, which each step copies out of the model's variable (so a loop that sets
the weights itself is followed). After the update, an allgather of each bucket's cuts gives
every rank's model every rank's parameters. Both stages reduce-scatter the gradients, which
puts on the link what the unsharded allreduce puts there (an allreduce and then the weights'
allgather would put half as much again); "gradients" also holds the backward pass back, so
that the whole gradients are let go as their buckets leave. docs/sharding.md says more.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

import horovod.tensorflow as hvd
import keras
import numpy as np
import tensorflow as tf

from hvd_train.distributed.checkpoint_files import Arrays
from hvd_train.distributed.sharding import Partition, Piece
from hvd_train.distributed.tensorflow.exchange import reached_only, zeros_from
from hvd_train.errors import UsageError

# Keras's optimizers whose update of an element reads that element's gradient and state alone
# (and numbers the same for every element): a piece of a parameter is updated as the whole.
ELEMENT_WISE = (
    keras.optimizers.SGD, keras.optimizers.Adam, keras.optimizers.AdamW, keras.optimizers.RMSprop,
    keras.optimizers.Adagrad, keras.optimizers.Adamax, keras.optimizers.Nadam,
    keras.optimizers.Adadelta, keras.optimizers.Ftrl, keras.optimizers.Lion,
)  # fmt: skip


# With shard = "gradients", the backward pass makes a bucket's gradients only once the bucket
# this many before it has been reduce-scattered: so that the pass, which would run on ahead of
# the exchange, holds no more than a few buckets' gradients (docs/sharding.md, "Memory").
HELD_BACK = 2


def _hold_back(gradients: list[tf.Tensor], sent: tf.Tensor, upstream: set[Any]) -> None:
    """Makes the ops that give `gradients` wait for the op that gives `sent`, in a graph being
    traced (eagerly, the gradients are made already); but any that this op itself waits for
    (found from its inputs, `upstream` holding what earlier calls found), which would never
    run."""
    if tf.executing_eagerly():
        return
    sending = sent.op
    waiting, seen = [sending], upstream
    while waiting:
        op = waiting.pop()
        for before in [*(tensor.op for tensor in op.inputs), *op.control_inputs]:
            if before not in seen:
                seen.add(before)
                waiting.append(before)
    for gradient in gradients:
        made = gradient.op
        if made not in seen and made.graph is sending.graph:
            made._add_control_input(sending)


def innermost(optimizer: keras.optimizers.Optimizer) -> keras.optimizers.Optimizer:
    """The optimizer that keeps the state: the one a LossScaleOptimizer wraps, or itself."""
    return getattr(optimizer, "inner_optimizer", optimizer)


def refused(optimizer: keras.optimizers.Optimizer, shard: str) -> str:
    """Why `optimizer` cannot be sharded, or ""."""
    inner = innermost(optimizer)
    name = type(inner).__name__
    if inner.built:
        return (f"{name} is built already (over the whole model), and shard = \"{shard}\" "
                "builds it over this rank's part; give it unbuilt, and load a state after "
                "setup")  # fmt: skip
    for option in ("clipnorm", "global_clipnorm"):
        if getattr(inner, option, None):
            return (f"{name}'s {option} would clip this rank's part by its own norm; clip with "
                    "gradient_clip_norm (setup's, or the recipe's [optimizer] one), which takes "
                    "the norm over every rank's part")  # fmt: skip
    return ""


@dataclass(frozen=True)
class Slot:
    """How one optimizer variable is shared out: "elements" (one per element of parameter
    `index`, each rank holding its piece's), "owned" (held by rank `owner` alone, in `shape`),
    or "same" (every rank holds all of it, alike: the step count, the learning rate)."""

    kind: str
    shape: tuple[int, ...]
    index: int = -1
    owner: int = 0


class KerasShards:
    """What this rank holds of the model's trained `variables` (`tensors`, one per parameter,
    in the parameters' order: `_held`'s), which `optimizer` is built over here; `split`: the
    parameters cut inside; `hold_back`: whether the backward pass waits on the exchange, so
    that a rank holds a few buckets' whole gradients at a time (ZeRO-2), or runs on ahead and
    may hold them all, as unsharded (ZeRO-1)."""

    def __init__(self, variables: list[Any], partition: Partition, rank: int,
                 optimizer: keras.optimizers.Optimizer, hold_back: bool, split: frozenset[int],
                 compression: Any) -> None:  # fmt: skip
        self.variables, self.partition, self.rank = variables, partition, rank
        self.hold_back, self.split, self.compression = hold_back, split, compression
        self.held = partition.pieces(rank)
        self.pieces: dict[int, Piece] = {p.index: p for pieces in self.held for p in pieces}
        dtypes = {v.dtype for v in variables}
        if len(dtypes) > 1:
            raise UsageError(
                f"setup: shard needs the trained variables in one dtype, and they are in "
                f'{sorted(dtypes)}; keep them in one, or set shard = "none"'
            )
        self.dtype = tf.as_dtype(dtypes.pop())
        self.tensors = [self._held(index, v) for index, v in enumerate(variables)]
        self.slots = self._build(optimizer)

    def _held(self, index: int, variable: Any) -> Any:
        """What this rank holds of parameter `index`: the model's `variable` itself, a variable
        of its own for its run of a split one, or an empty stand-in. Their values are copies
        (numpy's): a slice of the model's variable would share its buffer, and keep it once the
        variable is next assigned."""
        piece = self.pieces.get(index)
        if piece is not None and index not in self.split:
            return variable
        if piece is None:
            value = np.zeros(self._empty(index), variable.dtype)
        else:
            value = np.array(variable.numpy().reshape(-1)[piece.start : piece.stop])
        return keras.Variable(value, name=variable.name, dtype=variable.dtype)

    def cut(self, tensors: list[tf.Tensor]) -> list[tf.Tensor]:
        """Each parameter's `tensors` (its values, or its whole gradient) as this rank holds
        it: the whole (in its shape), its run (1-D, where it is split), or none (cut from the
        tensor too: what a collective sends must not be a constant, which TensorFlow's graph
        optimizer would run a Horovod op on before the step, alone)."""
        cut = []
        for index, tensor in enumerate(tensors):
            piece = self.pieces.get(index)
            if piece is None:
                cut.append(zeros_from(tensor, self._empty(index)))
            elif index in self.split:
                cut.append(tf.reshape(tensor, [-1])[piece.start : piece.stop])
            else:
                cut.append(tensor)
        return cut

    def _empty(self, index: int) -> list[int]:
        """The shape of a parameter's stand-in: as many dimensions, none long, so that whatever
        an optimizer makes of its shape (Adafactor its rows and columns) is empty too."""
        return [0] * max(1, len(self.variables[index].shape))

    def _build(self, optimizer: keras.optimizers.Optimizer) -> list[Slot]:
        """Builds `optimizer` over the pieces, and learns how each of its variables is shared
        out (from which piece each was made, and every rank's shapes)."""
        inner = innermost(optimizer)
        excluded: set[int] = getattr(inner, "_exclude_from_weight_decay", set())
        inner._exclude_from_weight_decay = excluded | {
            id(t) for v, t in zip(self.variables, self.tensors, strict=True) if id(v) in excluded
        }  # a loop's exclude_from_weight_decay(var_list=...), for its parameters' pieces
        made: dict[int, int] = {}
        own = inner.add_variable_from_reference
        positions = {id(t): index for index, t in enumerate(self.tensors)}

        def recorded(reference_variable: Any, *arguments: Any, **options: Any) -> Any:
            variable = own(reference_variable, *arguments, **options)
            made[id(variable)] = positions[id(reference_variable)]
            return variable

        inner.add_variable_from_reference = recorded
        try:
            optimizer.build(self.tensors)
        finally:
            del inner.add_variable_from_reference
        shapes = [tuple(v.shape) for v in optimizer.variables]
        everyone = hvd.allgather_object(shapes, name="hvd_train.optimizer_layout")
        slots = []
        for at, variable in enumerate(optimizer.variables):
            theirs = [rank[at] for rank in everyone]
            holders = [r for r, shape in enumerate(theirs) if np.prod(shape) > 0]
            index = made.get(id(variable), -1)
            if index in self.split:
                slots.append(Slot("elements", tuple(self.variables[index].shape), index))
            elif len(holders) == 1 < len(theirs):
                slots.append(Slot("owned", theirs[holders[0]], index, holders[0]))
            elif all(shape == theirs[0] for shape in theirs):
                slots.append(Slot("same", theirs[0], index))
            else:
                raise UsageError(
                    f"setup: {type(inner).__name__} keeps a variable ({variable.path}) that is "
                    f"neither per element nor one rank's ({theirs} across the ranks), so shard "
                    'cannot share it out; choose another optimizer, or set shard = "none"'
                )
        return slots

    def scatter(self, gradients: list[tf.Tensor]) -> list[tf.Tensor]:
        """The exchange: each bucket's gradients, end to end, cut into one part per rank
        (each padded to the longest: Horovod splits a tensor evenly), reduce-scattered,
        averaging; this rank's pieces of their averages, in the parameters' order (`cut`'s).
        One bucket at a time: each waits for the one before, so that no more than one
        bucket's buffer is held; with `hold_back`, the pass waits too (HELD_BACK)."""
        pieces = self.cut(gradients)  # the stand-ins; the pieces held are replaced below
        partition, received = self.partition, None
        upstream: set[Any] = set()  # the ops the reduce-scatters so far wait for
        for bucket, indices in enumerate(partition.buckets):
            with tf.control_dependencies([] if received is None else [received]):
                buffer = tf.concat(self._parts(bucket, gradients), 0)
            received = hvd.reducescatter(buffer, op=hvd.Average, compression=self.compression,
                                         name=f"hvd_train.scatter.{bucket}")  # fmt: skip
            if self.hold_back and bucket + HELD_BACK < len(partition.buckets):
                later = [gradients[index] for index in partition.buckets[bucket + HELD_BACK]]
                _hold_back(later, received, upstream)
            for piece in self.held[bucket]:
                values = received[piece.at : piece.at + piece.stop - piece.start]
                shape = self.variables[piece.index].shape
                pieces[piece.index] = (
                    values if piece.index in self.split else tf.reshape(values, shape)
                )
            if not self.held[bucket]:  # a stand-in from what came, or the graph drops the op
                first = indices[0]
                pieces[first] = zeros_from(received, self._empty(first))
        return pieces

    def _parts(self, bucket: int, gradients: list[tf.Tensor]) -> list[tf.Tensor]:
        """Bucket `bucket`'s gradients end to end, each rank's cut padded to the longest: the
        runs of each gradient in a cut, and zeros after it (one copy of the bucket in all)."""
        partition, parts = self.partition, []
        width, starts = partition.widths[bucket], partition.starts[bucket]
        for low, high in itertools.pairwise(partition.cuts[bucket]):
            for index in partition.buckets[bucket]:
                first = starts[index]
                start, stop = max(low, first), min(high, first + partition.sizes[index])
                if start < stop:
                    parts.append(tf.reshape(gradients[index], [-1])[start - first : stop - first])
            if high - low < width:
                parts.append(tf.zeros([width - (high - low)], self.dtype))
        return parts

    def norm(self, pieces: list[tf.Tensor]) -> tf.Tensor:
        """The norm of the whole averaged gradients, from every rank's `pieces`."""
        squares = tf.add_n([tf.reduce_sum(tf.square(tf.cast(p, tf.float64))) for p in pieces])
        total = hvd.allreduce(squares, op=hvd.Sum, name="hvd_train.norm")
        return tf.cast(tf.sqrt(total), tf.float32)

    def apply(self, optimizer: Any, gradients: list[tf.Tensor], reached: list[bool],
              finite: tf.Tensor) -> None:  # fmt: skip
        """Updates what this rank holds with its `gradients` of the parameters the step
        `reached` (`reached_only`) and gives every rank every rank's updated parameters.
        `finite`: whether the gradients were, on every rank (a LossScaleOptimizer skips, or
        not, on all ranks alike)."""
        for index in sorted(self.split.intersection(self.pieces)):  # runs: copied in
            piece, variable = self.pieces[index], self.variables[index]
            self.tensors[index].assign(tf.reshape(variable.value, [-1])[piece.start : piece.stop])
        optimizer.agreed_finite = finite
        try:
            optimizer.apply_own(reached_only(gradients, reached), self.tensors)
        finally:
            optimizer.agreed_finite = None
        # A skipped piece's average is read by nothing else, and a graph drops an op whose
        # result no one reads: its reduce-scatter would go on the other ranks only.
        self.gather({i: g for i, (g, r) in enumerate(zip(gradients, reached, strict=True))
                     if not r})  # fmt: skip

    def gather(self, waiting: dict[int, tf.Tensor] | None = None) -> None:
        """Every rank's parts into every rank's model variables: a grouped allgather of each
        bucket's parameters, each rank sending what it holds of each (all of it, its run, or
        nothing: a stand-in's value, not a constant, as `cut` says). Each parameter arrives
        in a buffer of its own, which its variable may keep (one buffer for the bucket would
        be kept whole by any of them). One bucket at a time: each waits until the one before
        is in the model, so that no more than one is held twice, and for what is `waiting` of
        its parameters."""
        assigned: list[Any] = []
        waiting = waiting or {}
        for bucket, indices in enumerate(self.partition.buckets):
            with tf.control_dependencies(
                [*assigned, *(waiting[i] for i in indices if i in waiting)]
            ):
                sent = [tf.reshape(self.tensors[index].value, [-1]) for index in indices]
            gathered = hvd.grouped_allgather(sent, name=f"hvd_train.weights.{bucket}")
            assigned = []
            for index, values in zip(indices, gathered, strict=True):
                variable = self.variables[index].value  # the tf.Variable: its assign is an op
                assigned.append(variable.assign(tf.reshape(values, variable.shape)))

    def arrays(self, variables: list[Any]) -> Arrays:
        """The optimizer's `variables` whole, onto rank 0 (the others get nothing), keyed as an
        unsharded optimizer's are; every rank calls it."""
        arrays: Arrays = {}
        for at, (slot, variable) in enumerate(zip(self.slots, variables, strict=True)):
            value = variable.value
            if slot.kind != "same":
                value = hvd.allgather(tf.reshape(value, [-1]), name=f"hvd_train.state.{at}")
            if self.rank == 0:
                size = int(np.prod(slot.shape))
                arrays[f"{at:04d}"] = np.reshape(value.numpy().reshape(-1)[:size], slot.shape)
        return arrays

    def check(self, state: Arrays) -> None:
        """A `ValueError` where `state` is not a whole state of this optimizer."""
        if sorted(state) != [f"{at:04d}" for at in range(len(self.slots))]:
            raise ValueError(f"{len(state)} optimizer tensors for {len(self.slots)} variables")
        for at, slot in enumerate(self.slots):
            if tuple(np.shape(state[f"{at:04d}"])) != slot.shape:
                raise ValueError(f"optimizer tensor {at:04d} is {np.shape(state[f'{at:04d}'])}, "
                                 f"and this optimizer's is {slot.shape}")  # fmt: skip

    def hand_out(self, variables: list[Any], state: Arrays | None) -> None:
        """Rank 0's whole `state` (None on the others, or where rank 0 loaded none), each
        variable cut into every rank's part as it is handed out; every rank calls it."""
        given = hvd.broadcast_object(state is not None, root_rank=0, name="hvd_train.optimizer")
        if not given:
            return
        for at, (slot, variable) in enumerate(zip(self.slots, variables, strict=True)):
            whole = np.zeros(slot.shape, variable.dtype) if state is None else state[f"{at:04d}"]
            whole = hvd.broadcast(tf.constant(whole, variable.dtype), root_rank=0,
                                  name=f"hvd_train.optimizer.{at}")  # fmt: skip
            if slot.kind == "elements":
                piece = self.pieces.get(slot.index)
                if piece is not None:  # a copy: a slice would keep `whole` (`_held` says why)
                    variable.assign(whole.numpy().reshape(-1)[piece.start : piece.stop].copy())
            elif slot.kind == "same" or slot.owner == self.rank:
                variable.assign(whole)
