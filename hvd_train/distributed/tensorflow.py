"""TensorFlow 2 with Keras 3 under Horovod.

Horovod 0.28.1's Keras integration targets Keras 2. With Keras 3, `DistributedGradientTape` and
`broadcast_variables` fail on Keras variables, and its Keras `DistributedOptimizer` would let
`model.fit` apply gradients that were never averaged. So this adapter uses Horovod's TensorFlow
ops directly: a compiled train step averages the gradients with `grouped_allreduce`, and
broadcasts act on the `tf.Variable`s under the Keras variables.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable
from pathlib import Path
from types import MappingProxyType
from typing import Any

import horovod.tensorflow as hvd
import keras
import numpy as np
import tensorflow as tf

from hvd_train.builders import keras_models
from hvd_train.data.base import MASK, batch_size
from hvd_train.distributed.backend import (
    Adapter,
    Arrays,
    Batch,
    Exported,
    Loss,
    ModelState,
    OverlapChoice,
    StepResult,
    buckets,
    keep_freed_memory,
)
from hvd_train.errors import UsageError
from hvd_train.recipe.settings import (
    EPSILON,
    LOSS_SCALED,
    RMSPROP_DECAY,
    Horovod,
    Optimizer,
    function_name,
)


def cross_entropy(logits: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
    """The mean over every example, and every position: logits (N, ..., C) for integer
    labels (N, ...)."""
    return tf.reduce_mean(
        keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True)
    )


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
    if isinstance(made._learning_rate, keras.optimizers.schedules.LearningRateSchedule):
        raise UsageError(
            f"optimizer.function ({name}): its optimizer has a learning rate schedule; give it "
            "a number, and the schedule to the recipe's Schedule(warmup_epochs=..., decay=...)"
        )
    return made


class TensorFlowAdapter(Adapter):
    name = "tensorflow"
    without_elastic = (
        "Horovod's elastic state for TensorFlow targets Keras 2; use --framework torch, or drop "
        "--elastic and rely on --resume"
    )
    hvd = hvd
    losses = MappingProxyType({"cross_entropy": cross_entropy})

    def init(self, may_overlap: bool = True) -> None:
        self.apply_horovod_defaults()
        keep_freed_memory()
        hvd.init()
        self.rank, self.local_rank = hvd.rank(), hvd.local_rank()
        self.world_size, self.local_size = hvd.size(), hvd.local_size()
        gpus = tf.config.list_physical_devices("GPU")
        if gpus:
            tf.config.experimental.set_memory_growth(gpus[self.local_rank], True)
            tf.config.set_visible_devices(gpus[self.local_rank], "GPU")
        else:
            threads = self.threads_per_rank()
            tf.config.threading.set_intra_op_parallelism_threads(threads)
            # Where the exchange may overlap, one op more at a time than cores: a pass's weight
            # gradients (and so their buckets' allreduces) then need not wait behind its whole
            # chain of input gradients, which one thread runs first. Elsewhere it costs the
            # pass a little (docs/history.md, "Overlap and models of real size").
            tf.config.threading.set_inter_op_parallelism_threads(
                threads + 1 if may_overlap else threads
            )

    def setup(
        self, model: Any, optimizer: Optimizer, loss: Loss, horovod: Horovod, precision: str
    ) -> None:
        # Mixed precision is the model's own Keras dtype policy, set as it was built.
        self.model = model
        self.loss = self.resolved_loss(loss)
        variables = self.model.trainable_variables
        decays = [True] * len(variables)
        if optimizer.function is not None:
            self.optimizer = _own_optimizer(optimizer.function)
            self.learning_rate = float(self.optimizer.learning_rate.numpy())
        else:
            self.optimizer = _optimizer(optimizer)
            self.learning_rate = optimizer.learning_rate
            names = [v.path for v in variables]
            decays = self.decayed(optimizer, names, keras_models.layer_types(model))
        if optimizer.name == "adamw":  # before the build, as Keras asks
            kept = [v for v, d in zip(variables, decays, strict=True) if not d]
            self.optimizer.exclude_from_weight_decay(var_list=kept)
        self.scaled = precision == LOSS_SCALED
        if self.scaled:
            self.optimizer = keras.optimizers.LossScaleOptimizer(self.optimizer)
        # Slots exist from the start, so the first broadcast covers them too.
        self.optimizer.build(variables)
        # sgd, adam and rmsprop take weight decay as an L2 term in the gradient, as torch does:
        # each variable's factor (0 where weight_decay_exclude keeps it out).
        coupled = optimizer.coupled_weight_decay
        self.l2 = [coupled * d for d in decays] if coupled else []
        self.clip_norm = optimizer.gradient_clip_norm
        self.compression = Cast(TRAVEL_DTYPES[horovod.compression])
        self.passes_per_step = horovod.backward_passes_per_step
        # Several backward passes per step: their gradients and loss, summed locally.
        totals = [*self.model.trainable_variables, tf.zeros([], tf.float32)]
        self.accumulators = [
            tf.Variable(tf.zeros_like(v), trainable=False)
            for v in totals
            if self.passes_per_step > 1
        ]
        self.seed_states = keras_models.seed_states(model)
        sizes = [
            np.dtype(v.dtype).itemsize * int(np.prod(v.shape)) for v in model.trainable_variables
        ]
        self.buckets = buckets(sizes)
        self.overlap_choice = OverlapChoice(horovod.overlap, len(self.buckets))
        self._compile()

    def _compile(self) -> None:
        """The step's graphs, each traced when first called; one for each way the gradients
        travel."""
        self._compiled_accumulate = Compiled(self._accumulate, batch_arguments=2)
        self._compiled_apply = {
            overlap: Compiled(functools.partial(self._apply, overlap=overlap), batch_arguments=2)
            for overlap in (False, True)
        }
        self._compiled_local = Compiled(self._local, batch_arguments=2)
        self._compiled_logits = Compiled(lambda x: self.model(x, training=False), batch_arguments=1)

    def broadcast_state(self, include_optimizer: bool) -> None:
        # Keras 3 variables wrap tf.Variables; Horovod can only assign to the latter. Fresh
        # optimizer slots are zeros on every rank, so broadcasting them always is harmless.
        variables = self.model.variables + self.optimizer.variables
        hvd.broadcast_variables([v.value for v in variables], root_rank=0)

    def sync_buffers(self) -> None:
        buffers = [v.value for v in self.model.non_trainable_weights]
        if buffers:
            hvd.broadcast_variables(buffers, root_rank=0)

    def step(
        self, batches: list[Batch], learning_rate: float, seed: int, flags: np.ndarray,
        overlap: bool,
    ) -> StepResult:  # fmt: skip
        started = time.time()  # the clock of tf.timestamp
        for index, (x, y) in enumerate(batches[:-1]):
            self._compiled_accumulate(x, y, tf.constant(seed + index, tf.int64))
        x, y = batches[-1]
        control, norm, first_full, computed, synced = self._compiled_apply[overlap](
            x, y, tf.constant(seed + len(batches) - 1, tf.int64),
            tf.constant(learning_rate, tf.float32), tf.constant(flags, tf.float32),
        )  # fmt: skip
        control = control.numpy()
        return StepResult(float(control[-1]), float(norm), control[:-1] * self.world_size,
                          float(computed) - started, float(synced - computed),
                          float(computed - first_full))  # fmt: skip

    def _gradients(self, x: tf.Tensor, y: tf.Tensor, seed: tf.Tensor) -> tuple[Any, tf.Tensor]:
        for index, state in enumerate(self.seed_states):
            state.assign(tf.cast(tf.stack([seed, index]), state.dtype))
        with tf.GradientTape() as tape:
            loss = self.loss(tf.cast(self.model(x, training=True), tf.float32), y)
            scaled = self.optimizer.scale_loss(loss)  # fp16-mixed: by the loss scale
        gradients = tape.gradient(scaled, self.model.trainable_variables)
        # An embedding's gradient comes as IndexedSlices. Made dense, as torch's are (Horovod's
        # sparse_as_dense), it adds up over passes and travels in the grouped allreduce.
        return [tf.convert_to_tensor(g) for g in gradients], loss

    def _accumulate(self, x: tf.Tensor, y: tf.Tensor, seed: tf.Tensor) -> None:
        """One of several backward passes of a step: its gradients and loss, kept locally."""
        gradients, loss = self._gradients(x, y, seed)
        for total, gradient in zip(self.accumulators, [*gradients, loss], strict=True):
            total.assign_add(gradient / self.passes_per_step)

    def _apply(
        self, x: tf.Tensor, y: tf.Tensor, seed: tf.Tensor, learning_rate: tf.Tensor,
        flags: tf.Tensor, overlap: bool,
    ) -> tuple[tf.Tensor, ...]:  # fmt: skip
        """The step's last backward pass, the average over ranks (of the gradients and, in the
        same allreduce, of the flags and the loss), and the update; with the times (of
        tf.timestamp) when the first bucket's gradients, the passes and the exchange were done.
        One graph: Horovod's ops run in it as soon as their inputs are ready, beside the rest,
        so with `overlap` each bucket's allreduce starts once the pass has made its gradients."""
        gradients, loss = self._gradients(x, y, seed)
        if self.accumulators:  # the earlier passes of this step, averaged locally first
            parts = zip(self.accumulators, [*gradients, loss], strict=True)
            *gradients, loss = [total + part / self.passes_per_step for total, part in parts]
            for total in self.accumulators:
                total.assign(tf.zeros_like(total))
        control = tf.concat([flags, tf.reshape(tf.cast(loss, tf.float32), [1])], axis=0)
        with tf.control_dependencies([gradients[index] for index in self.buckets[0]]):
            first_full = tf.timestamp()
        with tf.control_dependencies([*gradients, control, first_full]):
            computed = tf.timestamp()
        if self.world_size > 1:  # alone, there is nothing to exchange
            with tf.name_scope("hvd_train.step"):
                if overlap:
                    gradients, control = self._average(gradients, control, self.buckets)
                else:
                    with tf.control_dependencies([computed]):
                        everything = [list(range(len(gradients)))]
                        gradients, control = self._average(gradients, control, everything)
        with tf.control_dependencies([*gradients, control]):
            synced = tf.timestamp()
        norm = self._update(gradients, learning_rate)
        return control, norm, first_full if len(self.buckets) > 1 else computed, computed, synced

    def _update(self, gradients: list[tf.Tensor], learning_rate: tf.Tensor) -> tf.Tensor:
        """Applies the averaged gradients (clipped, with the L2 term); returns their norm
        before clipping. Under fp16-mixed they arrive scaled, and the optimizer divides them
        back, skipping the update (and lowering the scale) where they overflowed."""
        scale = self.optimizer.dynamic_scale if self.scaled else 1.0
        norm = tf.linalg.global_norm(gradients) / scale
        if self.clip_norm:  # on the averaged gradients, as the torch adapter does
            gradients, _ = tf.clip_by_global_norm(gradients, self.clip_norm * scale,
                                                  use_norm=norm * scale)  # fmt: skip
        variables = self.model.trainable_variables
        if self.l2:
            decayed = zip(gradients, variables, self.l2, strict=True)
            gradients = [g + l2 * scale * v if l2 else g for g, v, l2 in decayed]
        self.optimizer.learning_rate.assign(learning_rate)
        self.optimizer.apply_gradients(zip(gradients, variables, strict=True))
        if self.scaled:  # an overflow is a step skipped, not a fault
            norm = tf.where(tf.math.is_finite(norm), norm, 0.0)
        return norm

    def _average(
        self, gradients: list[tf.Tensor], control: tf.Tensor, groups: list[list[int]]
    ) -> tuple[list[tf.Tensor], tf.Tensor]:
        """The gradients averaged over the ranks in one grouped allreduce per group (one
        negotiation each), the control values in the last. Horovod's grouped op takes one
        dtype, so under compression the control values, which travel at full precision, take
        an allreduce of their own."""
        averaged = list(gradients)
        with_control = self.compression.dtype is None
        for number, group in enumerate(groups):
            tensors = [gradients[index] for index in group]
            last = with_control and number == len(groups) - 1
            sums = hvd.grouped_allreduce([*tensors, control] if last else tensors, op=hvd.Average,
                                         compression=self.compression)  # fmt: skip
            for index, tensor in zip(group, sums, strict=False):
                averaged[index] = tensor
            if last:
                control = sums[-1]
        if not with_control:
            control = hvd.allreduce(control, op=hvd.Average, name="hvd_train.control")
        return averaged, control

    def local_step(self, batches: list[Batch], seed: int) -> None:
        for index, (x, y) in enumerate(batches):
            self._compiled_local(x, y, tf.constant(seed + index, tf.int64))

    def _local(self, x: tf.Tensor, y: tf.Tensor, seed: tf.Tensor) -> None:
        gradients, _ = self._gradients(x, y, seed)
        self.optimizer.apply_gradients(zip(gradients, self.model.trainable_variables, strict=True))

    def gradient_allreduce(self) -> Callable[[], Any]:
        dtype = self.compression.dtype or tf.float32
        tensors = [tf.zeros(v.shape, dtype) for v in self.model.trainable_variables]
        # The tensors as arguments: Horovod names its graph ops after their inputs.
        reduce = tf.function(lambda parts: hvd.grouped_allreduce(parts, op=hvd.Average),
                             autograph=False)  # fmt: skip
        return lambda: reduce(tensors)

    def eval_batch(self, x: Any, y: Any = None) -> tuple[float, np.ndarray]:
        outputs = tf.cast(self._compiled_logits(x), tf.float32)
        if y is None:
            return math.nan, outputs.numpy()
        labels = tf.nest.map_structure(tf.constant, y)
        return float(self.loss(outputs, labels)) * batch_size(x), outputs.numpy()

    def export(self, path: Path, format: str, example: np.ndarray) -> Exported:
        expected = self.eval_batch(example)[1]
        if format == "keras":
            self.model.save(path)
            loaded = keras.saving.load_model(path)
            return path, expected, np.asarray(loaded(example, training=False), np.float32)
        self.model.export(str(path), format="tf_saved_model", verbose=False)
        saved = tf.saved_model.load(str(path))  # held: its functions need its variables
        return path, expected, tf.cast(saved.serve(tf.constant(example)), tf.float32).numpy()

    def state(self) -> ModelState:
        """The optimizer's state is every optimizer variable (iteration count, learning rate,
        slots), keyed by its index in the optimizer's list: Keras's own names hold per-process
        unique layer names."""
        optimizer = {
            f"{i:04d}": np.asarray(v.numpy()) for i, v in enumerate(self.optimizer.variables)
        }
        model = self.model
        return ModelState(keras_models.weights(model), keras_models.trained_names(model), optimizer)

    def load_state(self, weights: Arrays | None = None, optimizer: Arrays | None = None) -> None:
        if weights is not None:
            keras_models.load_weights(self.model, weights)
        if optimizer is not None:
            variables = self.optimizer.variables
            if sorted(optimizer) != [f"{i:04d}" for i in range(len(variables))]:
                raise ValueError(
                    f"{len(optimizer)} optimizer tensors for {len(variables)} variables"
                )
            for index, variable in enumerate(variables):
                variable.assign(optimizer[f"{index:04d}"])
