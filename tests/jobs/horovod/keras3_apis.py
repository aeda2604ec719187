"""Runs inside each rank under `horovodrun -np 2`: Horovod's own TensorFlow API on a Keras 3
model, each against a one-process reference computed here too (patches 16 and 20). Prints OK,
or fails.

- `broadcast_variables(model.variables)`: ranks that start apart hold rank 0's weights after;
- `DistributedGradientTape`, eagerly and in a tf.function: a step on each rank's half of a
  batch is the step of one process on the whole batch (SGD: the mean of the halves' mean
  gradients is the whole batch's);
- the Keras `DistributedOptimizer` through `model.fit`: the same, and the replicas agree;
- `load_model`: the model saved after that, with a DistributedOptimizer holding its state,
  trains on as one process;
- `SyncBatchNormalization`: a rank's half of a batch normalized as the whole batch;
- `BroadcastGlobalVariablesCallback(local_variables=...)`: a Keras 3 variable kept local keeps
  each rank's own value, the others take rank 0's;
- `elastic.TensorFlowKerasState`: a reset callback sets a plain Keras 3 optimizer's rate through
  Keras 2's `lr`, as Horovod's elastic examples do.
"""

import tempfile
from pathlib import Path

import horovod.tensorflow as hvd
import horovod.tensorflow.keras as hvd_keras
import keras
import numpy as np
import tensorflow as tf

hvd.init()
rank = hvd.rank()
rng = np.random.default_rng(0)
x = rng.standard_normal((8, 4)).astype(np.float32)
y = rng.standard_normal((8, 3)).astype(np.float32)
mine = slice(4 * rank, 4 * rank + 4)


def build(seed: int) -> keras.Model:
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])


def same(first: keras.Model, second: keras.Model) -> bool:
    return all(np.allclose(a, b, atol=1e-6, rtol=1e-5)
               for a, b in zip(first.get_weights(), second.get_weights(), strict=True))  # fmt: skip


def mse(model: keras.Model, inputs: np.ndarray, targets: np.ndarray) -> tf.Tensor:
    return tf.reduce_mean(tf.square(model(inputs) - targets))


OPTIMIZERS: dict[int, keras.optimizers.Optimizer] = {}  # one per model, made before any trace


def step(model: keras.Model, inputs: np.ndarray, targets: np.ndarray, distributed: bool) -> None:
    with tf.GradientTape() as tape:
        loss = mse(model, inputs, targets)
    tape = hvd.DistributedGradientTape(tape) if distributed else tape
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer = OPTIMIZERS[id(model)]
    optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))


model = build(seed=rank)
# Every rank builds as many models, so that their variables' names (which name Horovod's
# broadcasts in a traced function) agree.
assert (rank == 0) == same(model, build(seed=0)), "the ranks started alike"
hvd.broadcast_variables(model.variables, root_rank=0)
reference = build(seed=0)
assert same(model, reference), "broadcast_variables left this rank's own weights"
for built in (model, reference):
    OPTIMIZERS[id(built)] = keras.optimizers.SGD(0.1)
    OPTIMIZERS[id(built)].build(built.trainable_variables)

step(model, x[mine], y[mine], distributed=True)
step(reference, x, y, distributed=False)
assert same(model, reference), "DistributedGradientTape's step differs from one process's"
tf.function(step)(model, x[mine], y[mine], distributed=True)
tf.function(step)(reference, x, y, distributed=False)
assert same(model, reference), "DistributedGradientTape's traced step differs"

fitted, reference = build(seed=0), build(seed=0)
fitted.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.1)), loss="mse")
fitted.fit(x[mine], y[mine], batch_size=4, epochs=2, shuffle=False, verbose=0)
reference.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
reference.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
assert same(fitted, reference), "model.fit with DistributedOptimizer differs from one process"
everyone = hvd.allgather_object([w.tobytes() for w in fitted.get_weights()])
assert everyone[0] == everyone[1], "the replicas diverged under model.fit"

# hvd.load_model (patch 20): the saved model comes back with the saved optimizer state in a
# DistributedOptimizer, whose fit goes on as one process's.
folder = Path(tempfile.mkdtemp())
fitted.save(folder / "fitted.keras")
reference.save(folder / "reference.keras")
fitted = hvd_keras.load_model(folder / "fitted.keras")
reference = keras.models.load_model(folder / "reference.keras")
assert int(fitted.optimizer.iterations.numpy()) == 2, "load_model lost the optimizer's state"
fitted.fit(x[mine], y[mine], batch_size=4, epochs=1, shuffle=False, verbose=0)
reference.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
assert same(fitted, reference), "a model from hvd.load_model trains apart from one process"

# SyncBatchNormalization (patch 20): each rank's half of a batch normalized by the whole batch's
# statistics, and its moving statistics moved by them, as one process's BatchNormalization.
synced, whole = hvd.SyncBatchNormalization(), keras.layers.BatchNormalization()
mine_out, whole_out = synced(x[mine], training=True), whole(x, training=True)
assert np.allclose(mine_out, np.asarray(whole_out)[mine], atol=1e-5), "SyncBatchNormalization"
assert np.allclose(synced.moving_variance, whole.moving_variance, atol=1e-6), "its moving variance"
# BroadcastGlobalVariablesCallback (patch 20) takes Keras 3 variables to keep local: after the
# first batch (a step at rate 0), the kernel is rank 0's, the bias this rank's own.
apart, first = build(seed=rank), build(seed=0)
bias = apart.layers[0].bias.numpy()
local = hvd_keras.callbacks.BroadcastGlobalVariablesCallback(
    0, local_variables=[apart.layers[0].bias]
)
apart.compile(optimizer=hvd_keras.DistributedOptimizer(keras.optimizers.SGD(0.0)), loss="mse")
apart.fit(x[mine], y[mine], batch_size=4, epochs=1, verbose=0, callbacks=[local])
assert np.array_equal(apart.layers[0].kernel.numpy(), first.layers[0].kernel.numpy()), "kernel"
assert np.array_equal(apart.layers[0].bias.numpy(), bias), "the local bias was broadcast"

# The elastic Keras state (patch 20): a reset callback assigns the rate of a plain Keras 3
# optimizer through Keras 2's `lr`.
plain = keras.optimizers.Adam(0.001)
plain.build(apart.trainable_variables)
state = hvd.elastic.TensorFlowKerasState(apart, plain, batch=0)
state.register_reset_callbacks([lambda: plain.lr.assign(0.002)])
state.on_reset()
assert np.isclose(float(plain.learning_rate.numpy()), 0.002), "the reset left the rate"
print("OK", flush=True)
