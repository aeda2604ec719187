"""TensorFlow 2 with Keras 3 under Horovod: the TensorFlow backend of the distributed layer.

The model is a Keras model. The optimizer becomes distributed (`exchange.py`): its `apply`
averages the gradients with Horovod's TensorFlow ops, so a loop's own `GradientTape` step, and
`model.fit`, average. A recipe's step is one compiled graph (`compiled.py`): the backward
passes, the average (in buckets, each starting as soon as its gradients are made, where that
pays) and the update. Broadcasts act on the `tf.Variable`s under the Keras variables.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Iterator
from pathlib import Path
from types import MappingProxyType
from typing import Any

import horovod.tensorflow as hvd
import keras
import numpy as np
import tensorflow as tf

from hvd_train.data.base import batch_size
from hvd_train.distributed import keras_state
from hvd_train.distributed.backend import (
    Backend,
    Batch,
    Exported,
    Loss,
    ModelState,
    StepResult,
)
from hvd_train.distributed.checkpoint_files import Arrays
from hvd_train.distributed.host import start_horovod, threads_per_rank
from hvd_train.distributed.overlap import OverlapChoice
from hvd_train.distributed.sharding import Partition, too_large
from hvd_train.distributed.tensorflow import exchange as averaging
from hvd_train.distributed.tensorflow import sharding
from hvd_train.distributed.tensorflow.compiled import Compiled
from hvd_train.distributed.tensorflow.optimizers import has_schedule, made_optimizer
from hvd_train.errors import UsageError
from hvd_train.recipe.settings import LOSS_SCALED, ExchangeSettings, Optimizer


def cross_entropy(logits: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
    """The mean over every example, and every position: logits (N, ..., C) for integer
    labels (N, ...)."""
    return tf.reduce_mean(
        keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True)
    )


class TensorFlowBackend(Backend):
    name = "tensorflow"
    without_elastic = (
        "hvd_train's elastic mode is torch's only; use --framework torch, or drop --elastic and "
        "rely on --resume"
    )
    hvd = hvd
    losses = MappingProxyType({"cross_entropy": cross_entropy})

    def start(self, precision: str | None, may_overlap: bool) -> None:
        start_horovod(hvd)
        self.take_place()
        if precision is not None:  # the Keras models built from now on compute in it
            keras.config.set_dtype_policy(keras_state.POLICIES[precision])
        gpus = tf.config.list_physical_devices("GPU")
        if gpus:
            tf.config.experimental.set_memory_growth(gpus[self.local_rank], True)
            tf.config.set_visible_devices(gpus[self.local_rank], "GPU")
            self.device = f"/GPU:{self.local_rank}"
        else:
            threads = threads_per_rank(self.local_size)
            # Where the exchange may overlap, one op more at a time than cores: a pass's weight
            # gradients (and so their buckets' allreduces) then need not wait behind its whole
            # chain of input gradients, which one thread runs first. Elsewhere it costs the
            # pass a little (docs/history.md, "Overlap and models of real size").
            use_threads(threads, threads + 1 if may_overlap else threads)
            self.device = "/CPU:0"

    def setup(self, model: Any, optimizer: Any, settings: ExchangeSettings, clip_norm: float,
              loss: Loss, precision: str = "fp32") -> tuple[Any, Any]:  # fmt: skip
        if not isinstance(model, keras.Model):
            raise UsageError(
                f"setup: the model is a {type(model).__module__}.{type(model).__name__}, and this "
                "job runs TensorFlow; give a Keras model"
            )
        # Mixed precision is the model's own Keras dtype policy, set as it was built.
        self.model, self.loss = model, self.resolved_loss(loss)
        self._compile_without_xla(model)
        variables = model.trainable_variables
        self.optimizer = made_optimizer(optimizer)
        decays = [True] * len(variables)
        if isinstance(optimizer, Optimizer) and optimizer.function is None:
            names = [v.path for v in variables]
            types = keras_state.layer_types(model)
            decays = [optimizer.decays(n, t) for n, t in zip(names, types, strict=True)]
            if optimizer.name == "adamw":  # before the build, as Keras asks
                kept = [v for v, d in zip(variables, decays, strict=True) if not d]
                self.optimizer.exclude_from_weight_decay(var_list=kept)
        if isinstance(optimizer, Optimizer) and optimizer.function is None:
            self.learning_rate = optimizer.learning_rate  # the table's, not its float32 copy
        elif has_schedule(self.optimizer):
            self.learning_rate = np.nan
        else:
            self.learning_rate = float(self.optimizer.learning_rate.numpy())
        if precision == LOSS_SCALED:
            self.optimizer = keras.optimizers.LossScaleOptimizer(self.optimizer)
        # sgd, adam and rmsprop take a recipe's weight decay as an L2 term in the gradient, as
        # torch does: each variable's factor (0 where weight_decay_exclude keeps it out).
        coupled = optimizer.coupled_weight_decay if isinstance(optimizer, Optimizer) else 0.0
        self.l2 = [coupled * d for d in decays] if coupled else []
        self.exchange = averaging.GroupedExchange(
            variables, settings.compression, settings.backward_passes_per_step, settings.overlap,
            clip_norm, self.world_size,
        )  # fmt: skip
        self.sharded = settings.shard != "none" and self.world_size > 1
        if self.sharded:
            self._shard(variables, settings.shard)
        else:  # slots exist from the start, so the first broadcast covers them too
            self.optimizer.build(variables)
        averaging.distribute(self.optimizer, self.exchange)
        self.passes_per_step = settings.backward_passes_per_step
        # A recipe's step, with several backward passes: their gradients and loss, summed.
        totals = [*variables, tf.zeros([], tf.float32)]
        self.accumulators = [tf.Variable(tf.zeros_like(v), trainable=False)
                             for v in totals if self.passes_per_step > 1]  # fmt: skip
        self.seed_states = keras_state.seed_states(model)
        self.overlap_choice = OverlapChoice(settings.overlap, len(self.exchange.buckets))
        self.holding = False  # in no_sync: steps update with this rank's own gradients
        self._compile()
        return self.model, self.optimizer

    def _compile_without_xla(self, model: keras.Model) -> None:
        """`model.fit`'s step without XLA, whenever the model is compiled: Horovod's ops have no
        XLA kernels in this build, and Keras compiles with XLA by itself where a GPU is
        visible (`jit_compile="auto"`); said in one line, on rank 0, where XLA was asked for."""
        own_compile = model.compile

        def without_xla() -> None:
            if model.jit_compile:  # resolves "auto"
                model.jit_compile = False
                if self.rank == 0:
                    print("hvd-train: model.compile: jit_compile is off, as Horovod's ops have "
                          "no XLA kernels here; model.fit's step runs as a tf.function",
                          flush=True)  # fmt: skip

        def compile(*args: Any, **kwargs: Any) -> None:
            own_compile(*args, **kwargs)
            without_xla()

        model.compile = compile
        if getattr(model, "compiled", False):  # compiled before setup
            without_xla()

    def _shard(self, variables: list[Any], shard: str) -> None:
        """This rank's part of the optimizer's state and of the averaged gradients (with
        shard = "gradients", the backward pass held back too): the optimizer is built over
        what this rank holds of the variables (`sharding.KerasShards`)."""
        why = sharding.refused(self.optimizer, shard)
        if why:
            raise UsageError(f'setup: shard = "{shard}": {why}')
        sizes = [int(np.prod(v.shape)) for v in variables]
        element_wise = type(sharding.innermost(self.optimizer)) in sharding.ELEMENT_WISE
        split = too_large(sizes, self.world_size) if element_wise else frozenset()
        partition = Partition(sizes, self.exchange.buckets, self.world_size, whole=True,
                              split=split, join=True)  # fmt: skip
        self.exchange.shards = sharding.KerasShards(
            variables, partition, self.rank, self.optimizer, shard == "gradients", split,
            self.exchange.compression,
        )  # fmt: skip
        self.pending: Arrays | None = None  # a whole state loaded here, not yet handed out

    def _compile(self) -> None:
        """A recipe's step's graphs, each traced when first called; one for each way the
        gradients travel."""
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
        shards = self.exchange.shards
        if shards is not None:  # each rank's part of the optimizer's state, cut from rank 0's
            shards.hand_out(self.optimizer.variables, self.pending)
            self.pending = None
        variables = self.model.variables + ([] if shards else self.optimizer.variables)
        hvd.broadcast_variables([v.value for v in variables], root_rank=0)

    def sync_buffers(self) -> None:
        buffers = [v.value for v in self.model.non_trainable_weights]
        if buffers:
            hvd.broadcast_variables(buffers, root_rank=0)

    def tensors(self, x: Any, y: Any) -> tuple[Any, Any]:
        return tf.nest.map_structure(tf.convert_to_tensor, (x, y))

    def reseed(self, seed: int) -> None:
        for index, state in enumerate(getattr(self, "seed_states", ())):
            state.assign(keras_state.seed_state(seed, index, state.dtype))

    layout = "keras"

    @property
    def overlapping(self) -> bool:
        return self.overlap_choice.overlap

    def scale_learning_rate(self, factor: float) -> None:
        if has_schedule(self.optimizer):
            raise UsageError(
                "setup: scale_learning_rate scales a learning rate that is a number; scale the "
                "schedule's rates yourself, by the world size"
            )
        self.learning_rate *= factor
        self.optimizer.learning_rate.assign(self.learning_rate)

    def is_tensor(self, value: Any) -> bool:
        return tf.is_tensor(value) or isinstance(value, tf.Variable)

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Under TensorFlow, for `step` alone: a Keras loop has no backward pass of its own to
        hold (a loop of one's own accumulates with `backward_passes_per_step`)."""
        if self.sharded:
            raise UsageError(
                "no_sync(): a step inside updates with this rank's own gradients, and sharded, "
                "each rank holds its part of the state only: step outside no_sync()",
                every_rank=True,
            )
        self.holding = True
        try:
            yield
        finally:
            self.holding = False

    def step(
        self, batches: list[Batch], learning_rate: float, seed: int, carry: np.ndarray
    ) -> StepResult:
        if self.holding:
            return self._step_alone(batches, learning_rate, seed, carry)
        choice = self.overlap_choice
        started = time.time()  # the clock of tf.timestamp
        for index, (x, y) in enumerate(batches[:-1]):
            self._compiled_accumulate(x, y, tf.constant(seed + index, tf.int64))
        x, y = batches[-1]
        carried = np.concatenate([carry, choice.last])
        control, norm, first_full, computed, synced = self._compiled_apply[choice.overlap](
            x, y, tf.constant(seed + len(batches) - 1, tf.int64),
            tf.constant(learning_rate, tf.float32), tf.constant(carried, tf.float32),
        )  # fmt: skip
        averaged = control.numpy()
        compute, sync = float(computed) - started, float(synced - computed)
        choice.record(compute, sync, averaged[-3:-1])
        return StepResult(float(averaged[-1]), bool(np.isfinite(norm)), float(norm), averaged[:-3],
                          compute, sync, float(computed - first_full))  # fmt: skip

    def _gradients(
        self, x: tf.Tensor, y: tf.Tensor, seed: tf.Tensor
    ) -> tuple[list[tf.Tensor], tf.Tensor, list[bool]]:
        """The pass's gradients (dense, zeros where a variable has none), its loss, and which
        variables it reached (`averaging.dense`)."""
        for index, state in enumerate(self.seed_states):
            state.assign(tf.cast(tf.stack([seed, index]), state.dtype))
        with tf.GradientTape() as tape:
            loss = self.loss(tf.cast(self.model(x, training=True), tf.float32), y)
            scaled = self.optimizer.scale_loss(loss)  # fp16-mixed: by the loss scale
        variables = self.model.trainable_variables
        gradients, reached = averaging.dense(tape.gradient(scaled, variables), variables)
        return gradients, loss, reached

    def _accumulate(self, x: tf.Tensor, y: tf.Tensor, seed: tf.Tensor) -> None:
        """One of several backward passes of a step: its gradients and loss, kept locally."""
        gradients, loss, _ = self._gradients(x, y, seed)
        for total, gradient in zip(self.accumulators, [*gradients, loss], strict=True):
            total.assign_add(gradient / self.passes_per_step)

    def _apply(
        self, x: tf.Tensor, y: tf.Tensor, seed: tf.Tensor, learning_rate: tf.Tensor,
        carried: tf.Tensor, overlap: bool,
    ) -> tuple[tf.Tensor, ...]:  # fmt: skip
        """The step's last backward pass, the average over ranks (of the gradients and, in the
        same allreduce, of the carried values and the loss), and the update; with the times (of
        tf.timestamp) when the first bucket's gradients, the passes and the exchange were done.
        One graph: Horovod's ops run in it as soon as their inputs are ready, beside the rest,
        so with `overlap` each bucket's allreduce starts once the pass has made its gradients."""
        gradients, loss, reached = self._gradients(x, y, seed)
        if self.accumulators:  # the earlier passes of this step, averaged locally first
            parts = zip(self.accumulators, [*gradients, loss], strict=True)
            *gradients, loss = [total + part / self.passes_per_step for total, part in parts]
            for total in self.accumulators:
                total.assign(tf.zeros_like(total))
        control = tf.concat([carried, tf.reshape(tf.cast(loss, tf.float32), [1])], axis=0)
        buckets = self.exchange.buckets
        with tf.control_dependencies([gradients[index] for index in buckets[0]]):
            first_full = tf.timestamp()
        with tf.control_dependencies([*gradients, control, first_full]):
            computed = tf.timestamp()
        if overlap:
            gradients, control = self.exchange.average(gradients, control, buckets, reached)
        else:
            with tf.control_dependencies([computed]):
                everything = [list(range(len(gradients)))]
                gradients, control = self.exchange.average(gradients, control, everything,
                                                           reached)  # fmt: skip
        with tf.control_dependencies([*gradients, control]):
            synced = tf.timestamp()
        norm = self._update(gradients, learning_rate, reached)
        return control, norm, first_full if len(buckets) > 1 else computed, computed, synced

    def _update(
        self, gradients: list[tf.Tensor], learning_rate: tf.Tensor, reached: list[bool]
    ) -> tf.Tensor:
        """Applies the averaged gradients (clipped, with the L2 term) to the variables the
        step `reached`; returns their norm before clipping. Under fp16-mixed they arrive
        scaled, and the optimizer divides them back, skipping the update (and lowering the
        scale) where they overflowed."""
        scale = averaging.loss_scale(self.optimizer)
        gradients, norm = self.exchange.clipped(gradients, scale)
        variables = self.model.trainable_variables
        if self.l2:
            decayed = zip(gradients, self.exchange.values(variables), self.l2, strict=True)
            gradients = [g + l2 * scale * v if l2 else g for g, v, l2 in decayed]
        self.optimizer.learning_rate.assign(learning_rate)
        self.exchange.apply(self.optimizer, gradients, variables, norm, reached)
        if isinstance(self.optimizer, keras.optimizers.LossScaleOptimizer):
            norm = tf.where(tf.math.is_finite(norm), norm, 0.0)  # a skipped step, not a fault
        return norm

    def _step_alone(
        self, batches: list[Batch], learning_rate: float, seed: int, carry: np.ndarray
    ) -> StepResult:
        """`step` inside `no_sync`: each pass's update with this rank's own gradients, which
        never reach Horovod; `carry` comes back as it was given."""
        started = time.time()
        self.optimizer.learning_rate.assign(learning_rate)
        losses = [float(self._compiled_local(x, y, tf.constant(seed + index, tf.int64)))
                  for index, (x, y) in enumerate(batches)]  # fmt: skip
        return StepResult(float(np.mean(losses)), True, None, np.asarray(carry, np.float64),
                          time.time() - started, 0.0, 0.0)  # fmt: skip

    def _local(self, x: tf.Tensor, y: tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
        gradients, loss, reached = self._gradients(x, y, seed)
        kept = averaging.reached_only(gradients, reached)
        self.optimizer.apply_own(kept, self.model.trainable_variables)
        return loss

    def input_names(self) -> tuple[str, ...] | None:
        return keras_state.input_names(self.model)

    def eval_batch(self, x: Any, y: Any = None) -> tuple[float, np.ndarray]:
        outputs = tf.cast(self._compiled_logits(x), tf.float32)
        if y is None:
            return np.nan, outputs.numpy()
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

    def state(self, optimizer: bool = True, weights: bool = True) -> ModelState:
        """The optimizer's state is every optimizer variable (iteration count, learning rate,
        slots), keyed by its index in the optimizer's list: Keras's own names hold per-process
        unique layer names."""
        variables = self.optimizer.variables if optimizer else []
        shards = self.exchange.shards
        if shards is not None and optimizer:  # gathered onto rank 0
            arrays = shards.arrays(variables)
        else:
            arrays = {f"{i:04d}": np.asarray(v.numpy()) for i, v in enumerate(variables)}
        model = self.model
        held = keras_state.weights(model) if weights else {}
        return ModelState(held, keras_state.trained_names(model), arrays)

    def load_state(self, weights: Arrays | None = None, optimizer: Arrays | None = None) -> None:
        if weights is not None:
            keras_state.load_weights(self.model, weights)
        if optimizer is not None and self.exchange.shards is not None:
            self.exchange.shards.check(optimizer)
            self.pending = optimizer  # handed out by broadcast_state
        elif optimizer is not None:
            variables = self.optimizer.variables
            if sorted(optimizer) != [f"{i:04d}" for i in range(len(variables))]:
                raise ValueError(
                    f"{len(optimizer)} optimizer tensors for {len(variables)} variables"
                )
            for index, variable in enumerate(variables):
                variable.assign(optimizer[f"{index:04d}"])


def use_threads(intra_op: int, inter_op: int) -> None:
    """TensorFlow's thread pools sized for this rank. TensorFlow fixes them when it runs its
    first op: a later layer in the same process (`hvd_train.train` called again, with another
    recipe) keeps the pools the first one sized, which changes only its speed."""
    threading = tf.config.threading
    for get, put, wanted in (
        (threading.get_intra_op_parallelism_threads, threading.set_intra_op_parallelism_threads,
         intra_op),
        (threading.get_inter_op_parallelism_threads, threading.set_inter_op_parallelism_threads,
         inter_op),
    ):  # fmt: skip
        if get() != wanted:
            with contextlib.suppress(RuntimeError):  # "cannot be modified after initialization"
                put(wanted)
