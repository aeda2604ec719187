"""A loop of one's own with a learning-rate scheduler, as docs/own-loop.md shows it, in three
runs, each on a layer (and a model) of its own: two epochs straight; one epoch; and the second
epoch resumed from that one's checkpoint (`dist.load`, the scheduler's state back from the saved
values). torch: SGD with momentum and StepLR; TensorFlow: SGD with momentum and a staircase
ExponentialDecay, Keras's step schedule. Each run saves into OUT/<run>/checkpoints.

usage: own_loop_scheduled.py FRAMEWORK OUT
"""

import sys
from pathlib import Path

import numpy as np

from hvd_train import Distributed

framework, out = sys.argv[1], Path(sys.argv[2])
rng = np.random.default_rng(0)
X = rng.standard_normal((512, 8)).astype(np.float32)
Y = (X[:, :3].argmax(axis=1)).astype(np.int64)
BATCH = 32


def torch_run(dist: Distributed, folder: Path, epochs: int, resume: bool) -> None:
    import torch
    import torch.nn.functional as F

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    model, optimizer = dist.setup(model, optimizer)
    train = dist.loader((X, Y), BATCH)
    start = 0
    if resume:
        saved = dist.load(folder)
        scheduler.load_state_dict(saved["scheduler"])
        start = saved["epoch"]
    for epoch in range(start, epochs):
        train.set_epoch(epoch)
        for x, y in train:
            optimizer.zero_grad()
            dist.backward(F.cross_entropy(model(x), y))
            optimizer.step()
        scheduler.step()
        dist.save(folder, {"model": model, "optimizer": optimizer, "epoch": epoch + 1,
                           "scheduler": scheduler.state_dict()})  # fmt: skip


def tensorflow_run(dist: Distributed, folder: Path, epochs: int, resume: bool) -> None:
    import keras
    import tensorflow as tf

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                              keras.layers.Dense(3)])  # fmt: skip
    train = dist.loader((X, Y), BATCH)
    schedule = keras.optimizers.schedules.ExponentialDecay(
        0.1, decay_steps=len(train), decay_rate=0.5, staircase=True
    )
    model, optimizer = dist.setup(model, keras.optimizers.SGD(schedule, momentum=0.9))
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function
    def step(x: tf.Tensor, y: tf.Tensor) -> None:
        with tf.GradientTape() as tape:
            value = loss(y, model(x, training=True))
        gradients = tape.gradient(value, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables, strict=True))

    start = 0
    if resume:
        start = dist.load(folder)["epoch"]
    for epoch in range(start, epochs):
        train.set_epoch(epoch)
        for x, y in train:
            step(x, y)
        dist.save(folder, {"model": model, "optimizer": optimizer, "epoch": epoch + 1})


run = torch_run if framework == "torch" else tensorflow_run
for name, epochs, resume in (("straight", 2, False), ("resumed", 1, False), ("resumed", 2, True)):
    run(Distributed(framework), out / name, epochs, resume)
