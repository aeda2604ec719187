"""TensorFlow 2 with Keras 3 under Horovod.

Horovod 0.28.1's Keras integration targets Keras 2. With Keras 3, `DistributedGradientTape` and
`broadcast_variables` fail on Keras variables, and its Keras `DistributedOptimizer` would let
`model.fit` apply gradients that were never averaged. So this adapter uses Horovod's TensorFlow
ops directly: a compiled train step averages the gradients with `grouped_allreduce`, and
broadcasts act on the `tf.Variable`s under the Keras variables.
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # before TensorFlow loads: fewer runtime logs

from typing import Any

import horovod.tensorflow as hvd
import keras
import numpy as np
import tensorflow as tf

from hvd_train.adapters.base import Adapter, Arrays
from hvd_train.recipe import Layer, Recipe


def build_model(recipe: Recipe) -> keras.Sequential:
    """The recipe's layers, named `layer<i>` by their index in the recipe; the final softmax is
    left to the loss (cross-entropy on logits is the numerically stable form). Keras's own
    layouts (kernels (h, w, in, out) and (in, out), channels-last) are the neutral layout."""
    layers: list[Any] = [keras.Input(recipe.input_shape)]
    layers += [_layer(layer, index) for index, layer in enumerate(recipe.layers[:-1])]
    return keras.Sequential(layers, name="model")


def _layer(layer: Layer, index: int) -> keras.layers.Layer:
    name, params = f"layer{index}", layer.params
    match layer.type:
        case "conv2d":
            return keras.layers.Conv2D(params["filters"], params["kernel_size"], name=name)
        case "maxpool2d":
            return keras.layers.MaxPooling2D(params["pool_size"], name=name)
        case "dropout":
            return keras.layers.Dropout(params["rate"], name=name)
        case "flatten":
            return keras.layers.Flatten(name=name)
        case "dense":
            return keras.layers.Dense(params["units"], name=name)
        case "relu":
            return keras.layers.ReLU(name=name)
    raise ValueError(f"no Keras layer for {layer.type!r}")


def _optimizer(recipe: Recipe) -> keras.optimizers.Optimizer:
    config = recipe.optimizer
    lr = config.learning_rate
    if config.name == "sgd":
        return keras.optimizers.SGD(lr, momentum=config.momentum)
    if config.name == "adam":
        return keras.optimizers.Adam(lr, epsilon=1e-8)  # torch's epsilon, for parity
    return keras.optimizers.AdamW(lr, weight_decay=config.weight_decay, epsilon=1e-8)


class TensorFlowAdapter(Adapter):
    name = "tensorflow"

    def init(self) -> None:
        hvd.init()
        self.rank, self.local_rank = hvd.rank(), hvd.local_rank()
        self.world_size, self.local_size = hvd.size(), hvd.local_size()
        gpus = tf.config.list_physical_devices("GPU")
        if gpus:
            tf.config.experimental.set_memory_growth(gpus[self.local_rank], True)
            tf.config.set_visible_devices(gpus[self.local_rank], "GPU")
        else:
            tf.config.threading.set_intra_op_parallelism_threads(self.threads_per_rank())
            tf.config.threading.set_inter_op_parallelism_threads(self.threads_per_rank())

    def build(self, recipe: Recipe, seed: int) -> None:
        keras.utils.set_random_seed(seed)
        self.model = build_model(recipe)
        self.optimizer = _optimizer(recipe)
        # Slots exist from the start, so the first broadcast covers them too.
        self.optimizer.build(self.model.trainable_variables)
        config = recipe.optimizer
        # sgd and adam take weight decay as an L2 term in the gradient, as torch does.
        self.l2 = config.weight_decay if config.name in ("sgd", "adam") else 0.0
        self.clip_norm = config.gradient_clip_norm
        self.compression = (
            hvd.Compression.fp16 if recipe.horovod.fp16_compression else hvd.Compression.none
        )
        self.passes_per_step = recipe.horovod.backward_passes_per_step
        self.passes = 0
        self.accumulators = [
            tf.Variable(tf.zeros_like(v), trainable=False)
            for v in self.model.trainable_variables
            if self.passes_per_step > 1
        ]
        self.seed_generators = [
            layer.seed_generator for layer in self.model.layers if hasattr(layer, "seed_generator")
        ]
        self._compiled_step = tf.function(self._step, reduce_retracing=True)
        self._compiled_logits = tf.function(
            lambda images: self.model(images, training=False), reduce_retracing=True
        )

    def broadcast_state(self, include_optimizer: bool) -> None:
        # Keras 3 variables wrap tf.Variables; Horovod can only assign to the latter. Fresh
        # optimizer slots are zeros on every rank, so broadcasting them always is harmless.
        variables = self.model.variables + self.optimizer.variables
        hvd.broadcast_variables([v.value for v in variables], root_rank=0)

    def train_step(
        self, images: np.ndarray, labels: np.ndarray, learning_rate: float, seed: int
    ) -> float:
        for generator in self.seed_generators:
            generator.state.assign(np.array([seed, 0], dtype=generator.state.dtype))
        self.optimizer.learning_rate = learning_rate
        self.passes += 1
        apply = self.passes % self.passes_per_step == 0
        return float(self._compiled_step(images, labels, apply))

    def _step(self, images: tf.Tensor, labels: tf.Tensor, apply: bool) -> tf.Tensor:
        with tf.GradientTape() as tape:
            logits = self.model(images, training=True)
            loss = tf.reduce_mean(
                keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True)
            )
        gradients = tape.gradient(loss, self.model.trainable_variables)
        if self.accumulators:  # several backward passes per step: average them locally first
            for total, gradient in zip(self.accumulators, gradients, strict=True):
                total.assign_add(gradient / self.passes_per_step)
            if not apply:
                return loss
            gradients = [tf.identity(total) for total in self.accumulators]
            for total in self.accumulators:
                total.assign(tf.zeros_like(total))
        self._apply_averaged(gradients)
        return loss

    def _apply_averaged(self, gradients: list[tf.Tensor]) -> None:
        variables = self.model.trainable_variables
        gradients = hvd.grouped_allreduce(gradients, op=hvd.Average, compression=self.compression)
        if self.clip_norm:  # on the averaged gradients, as the torch adapter does
            gradients, _ = tf.clip_by_global_norm(gradients, self.clip_norm)
        if self.l2:
            gradients = [g + self.l2 * v for g, v in zip(gradients, variables, strict=True)]
        self.optimizer.apply_gradients(zip(gradients, variables, strict=True))

    def logits(self, images: np.ndarray) -> np.ndarray:
        return self._compiled_logits(images).numpy()

    def allreduce_sum(self, values: np.ndarray) -> np.ndarray:
        tensor = tf.constant(np.asarray(values, dtype=np.float64))
        return hvd.allreduce(tensor, op=hvd.Sum, name="hvd_train.metrics").numpy()

    def broadcast_object(self, value: Any) -> Any:
        return hvd.broadcast_object(value, root_rank=0)

    def allgather_object(self, value: Any) -> list[Any]:
        return list(hvd.allgather_object(value))

    def weights(self) -> Arrays:
        return {
            f"{layer.name}.{kind}": getattr(layer, kind).numpy()
            for layer in self.model.layers
            if layer.weights
            for kind in ("kernel", "bias")
        }

    def load_weights(self, weights: Arrays) -> None:
        for name, array in weights.items():
            layer, kind = name.split(".")
            getattr(self.model.get_layer(layer), kind).assign(array)

    def optimizer_state(self) -> Arrays:
        """Every optimizer variable (iteration count, slots), keyed by its Keras path."""
        return {_slot_name(v): np.asarray(v.numpy()) for v in self.optimizer.variables}

    def load_optimizer_state(self, state: Arrays) -> None:
        for variable in self.optimizer.variables:
            variable.assign(state[_slot_name(variable)])


def _slot_name(variable: keras.Variable) -> str:
    """The variable's path without the optimizer's own name, which Keras makes unique per
    process ('adam', 'adam_1', ...): 'adam/model_layer0_kernel_momentum' -> the part after '/'."""
    return str(variable.path).split("/", 1)[1]
