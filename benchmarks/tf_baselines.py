"""The same model under TensorFlow with Keras 3, trained two other ways:

    python tf_baselines.py plain RECIPE STEPS         one process, a compiled tf.function loop
    python tf_baselines.py alternate RECIPE STEPS     that loop and hvd_train's step taking
                                                      turns in one process
    python tf_baselines.py mwms RECIPE STEPS          one worker of MultiWorkerMirroredStrategy;
                                                      TF_CONFIG names the cluster and this worker

MultiWorkerMirroredStrategy trains with a custom loop (`strategy.run`): `model.fit` under it
fails on TensorFlow 2.21 with Keras 3 ("Attempt to convert a value (PerReplica...)").
Threads: $THREADS per process (intra-op and inter-op pools). benchmarks.run gives every system
hvd_train's TensorFlow environment (oneDNN's kernels on), so they differ only in how they train.
"""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras
import tensorflow as tf

from benchmarks.common import alternate, measure, report, setup
from hvd_train.builders.keras_models import build_neutral
from hvd_train.training.run import may_overlap

WARMUP = 10


def loss_of(labels, logits):
    return tf.reduce_mean(
        keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True)
    )


def plain_step(recipe):
    model = build_neutral(recipe.layers, recipe.data.input_shape).model
    optimizer = keras.optimizers.Adam(1e-3)

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_of(y, model(x, training=True))
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables, strict=True))

    return step


def plain(recipe, train, steps: int) -> float:
    return measure(plain_step(recipe), train, recipe.schedule.batch_size, 0, 1, steps, WARMUP)


def mwms(recipe, train, steps: int) -> float:
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    config = json.loads(os.environ["TF_CONFIG"])
    rank, world = config["task"]["index"], len(config["cluster"]["worker"])
    with strategy.scope():
        model = build_neutral(recipe.layers, recipe.data.input_shape).model
        optimizer = keras.optimizers.Adam(1e-3)

    def replica_step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_of(y, model(x, training=True))
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables, strict=True))

    @tf.function
    def step(x, y):
        strategy.run(replica_step, args=(x, y))

    @tf.function
    def barrier():
        strategy.run(lambda: tf.distribute.get_replica_context().all_reduce("sum", 1.0))

    return measure(step, train, recipe.schedule.batch_size, rank, world, steps, WARMUP, barrier)


if __name__ == "__main__":
    mode, recipe_name, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
    config = json.loads(os.environ.get("TF_CONFIG", "{}"))
    processes = len(config["cluster"]["worker"]) if config else 1
    rank = config["task"]["index"] if config else 0
    threads = int(os.environ.get("THREADS") or max(1, len(os.sched_getaffinity(0)) // processes))
    recipe, train = setup(recipe_name)
    # Taking turns, the plain loop runs on the pools hvd_train's backend sets for the recipe
    # (a spare inter-op thread where its exchange may overlap); TensorFlow fixes them once.
    spare = mode == "alternate" and may_overlap(recipe)
    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(threads + 1 if spare else threads)
    if mode == "alternate":
        hvd_train, plain_loop = alternate("tensorflow", recipe, plain_step(recipe), train, steps,
                                          WARMUP)  # fmt: skip
        report("hvd_train tensorflow and a plain tf.function loop, taking turns", processes,
               threads, hvd_train, plain_images_per_second=plain_loop)  # fmt: skip
    else:
        images_per_second = {"plain": plain, "mwms": mwms}[mode](recipe, train, steps)
        if rank == 0:
            name = {
                "plain": "TensorFlow, plain tf.function loop",
                "mwms": "TensorFlow MultiWorkerMirroredStrategy (custom loop)",
            }[mode]
            report(name, processes, threads, images_per_second)
