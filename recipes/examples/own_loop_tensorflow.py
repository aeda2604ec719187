"""Horovod's examples/tensorflow2/tensorflow2_mnist.py (v0.28.1), ported to hvd_train's own-loop
layer: the same Keras model and GradientTape step, written by hand as there, with hvd_train's
data reading, checkpoints and exact resume. `recipe` names the model and the data for
`hvd-train eval`.

    horovodrun -np 2 python recipes/examples/own_loop_tensorflow.py --epochs 2 --output-dir runs/tf
    python recipes/examples/own_loop_tensorflow.py --np 2 --epochs 3 --output-dir runs/tf --resume
    hvd-train eval --checkpoint runs/tf --framework tensorflow
"""

import argparse
from itertools import islice
from pathlib import Path

import keras
import numpy as np
import tensorflow as tf

from hvd_train import Data, Distributed, Recipe, launch
from hvd_train.errors import UsageError

HERE = str(Path(__file__).resolve())


def mnist_model():
    layers = keras.layers
    return keras.Sequential([
        keras.Input((28, 28, 1)),
        layers.Conv2D(32, 3, activation="relu"), layers.Conv2D(64, 3, activation="relu"),
        layers.MaxPooling2D(2), layers.Dropout(0.25), layers.Flatten(),
        layers.Dense(128, activation="relu"), layers.Dropout(0.5),
        layers.Dense(10, activation="softmax"),
    ])  # fmt: skip


def loss(probabilities, labels):
    return tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(labels, probabilities))


recipe = Recipe(data=Data("mnist"), keras_model=mnist_model, loss=loss, metrics=("accuracy",))


def main(epochs=2, output_dir="runs/own-loop-tensorflow", resume=False, batch_size=128,
         seed=42, data_dir=None, limit_steps=None):  # fmt: skip
    dist = Distributed("tensorflow")
    keras.utils.set_random_seed(seed)
    model, optimizer = dist.setup(mnist_model(), keras.optimizers.Adam(0.001),
                                  scale_learning_rate="linear")  # fmt: skip
    mnist = Data("mnist").load(data_dir)
    train = dist.loader(mnist.train, batch_size, seed=seed)
    test = dist.loader(mnist.test, 1000, shuffle=False)

    @tf.function(reduce_retracing=True)
    def training_step(images, labels):
        with tf.GradientTape() as tape:
            loss_value = loss(model(images, training=True), labels)
        grads = tape.gradient(loss_value, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))  # averaged
        return loss_value

    first, accuracy = 0, None
    if resume:
        saved = dist.load(output_dir)
        if saved is None:
            raise UsageError(f"--resume: {output_dir} holds no checkpoint; leave --resume out")
        first = saved["epoch"]
    for epoch in range(first, epochs):
        train.set_epoch(epoch)
        for index, (images, labels) in enumerate(islice(train, limit_steps)):
            loss_value = training_step(images, labels)
            if index % 100 == 0:
                dist.print(f"epoch {epoch + 1}: step {index}/{len(train)}, loss {loss_value:.4f}")
        dist.save(output_dir, {"model": model, "optimizer": optimizer, "epoch": epoch + 1},
                  recipe=HERE)  # fmt: skip
        counts = sum(np.array([np.sum(np.argmax(model(x), 1) == y), len(y)]) for x, y in test)
        correct, count = dist.all_reduce(counts, op="sum")
        accuracy = correct / count
        dist.print(f"epoch {epoch + 1}: test accuracy {accuracy:.2%}")
    return accuracy


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--output-dir", default="runs/own-loop-tensorflow")
    parser.add_argument("--resume", action="store_true", help="continue from the newest checkpoint")
    parser.add_argument("--data-dir", help="the four MNIST files (default: the cache)")
    parser.add_argument("--limit-steps", type=int, help="batches per epoch (default: all)")
    parser.add_argument("--np", type=int, help="start this many ranks here with hvd_train.launch")
    options = vars(parser.parse_args())
    if options["limit_steps"] is not None and options["limit_steps"] < 1:
        parser.error("--limit-steps: give a positive number of batches an epoch")
    ranks = options.pop("np")
    launch(main, np=ranks, **options) if ranks else main(**options)
