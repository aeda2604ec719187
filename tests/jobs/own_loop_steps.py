"""Runs inside each rank under `horovodrun -np 2`: a few steps of a loop of one's own on the
layer, in one VARIANT of how it steps, on a fixed global batch that the ranks split in halves
(each rank's half in two passes where the variant accumulates). Alone, it is the reference:
the plain step, in fp32, of one process on the whole batch. Saves the weights where it ends
(OUT/VARIANT-WORLD.npz, by rank 0) and checks that the replicas hold the same state bit for bit.

usage: own_loop_steps.py FRAMEWORK OUT VARIANT [VARIANT ...]
One process serves every VARIANT in turn, each on a layer (and a model) of its own.
"""

import os
import sys
from pathlib import Path

import numpy as np

from hvd_train import Distributed

STEPS, BATCH, FEATURES, CLASSES = 4, 16, 8, 4
rng = np.random.default_rng(0)
x = rng.standard_normal((STEPS, 2 * BATCH, FEATURES)).astype(np.float32)
y = rng.integers(0, CLASSES, (STEPS, 2 * BATCH))
reference = "HOROVOD_RANK" not in os.environ  # alone, not under horovodrun


ACCUMULATING = ("no_sync", "passes")  # a backward pass past the step's last is refused


def halves(step: int, rank: int, variant: str) -> list[tuple[np.ndarray, np.ndarray]]:
    """This rank's half of the step's batch, in two passes where the variant accumulates (in
    one otherwise); the reference's whole, in one."""
    if reference:
        return [(x[step], y[step])]
    mine = slice(rank * BATCH, (rank + 1) * BATCH)
    xs, ys = x[step, mine], y[step, mine]
    if variant not in ACCUMULATING:
        return [(xs, ys)]
    return [(xs[: BATCH // 2], ys[: BATCH // 2]), (xs[BATCH // 2 :], ys[BATCH // 2 :])]


def steps(framework: str, variant: str, out: Path) -> None:
    stepping = "plain" if reference else variant
    dist = Distributed(framework, precision="fp16-mixed" if stepping == "fp16-mixed" else "fp32")
    world, rank = dist.world_size, dist.rank
    settings = {"bf16": {"compression": "bf16"}, "passes": {"backward_passes_per_step": 2},
                "buckets": {"overlap": True}}.get(stepping, {})  # fmt: skip
    if framework == "torch":
        import torch
        import torch.nn.functional as F
        from torch import nn

        torch.manual_seed(0)
        width = 700 if variant == "buckets" else 32  # 2 M parameters: buckets of 4 MB
        model = nn.Sequential(nn.Linear(FEATURES, width), nn.ReLU(), nn.Linear(width, width),
                              nn.ReLU(), nn.Linear(width, CLASSES))  # fmt: skip
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        schedule = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
        model, optimizer = dist.setup(model, optimizer, **settings)
        for step in range(STEPS):
            if stepping in ("module-zero-grad", "buckets"):
                model.zero_grad()  # the .grads set to None, as torch's default does
            else:
                optimizer.zero_grad()
            batches = halves(step, rank, variant)
            for index, (inputs, labels) in enumerate(batches):
                inputs, labels = torch.from_numpy(inputs), torch.from_numpy(labels)
                loss = F.cross_entropy(model(inputs), labels) / len(batches)  # the passes' mean
                if stepping == "no_sync" and index == 0:
                    with dist.no_sync():
                        dist.backward(loss)
                elif stepping in ("plain", "module-zero-grad"):
                    loss.backward()
                else:
                    dist.backward(loss)
            optimizer.step()
            schedule.step()
        weights = {name: p.detach().numpy() for name, p in model.named_parameters()}
        weights["learning_rate"] = np.array(optimizer.param_groups[0]["lr"])
    else:
        import keras
        import tensorflow as tf

        keras.utils.set_random_seed(0)
        layers = [keras.Input((FEATURES,)), keras.layers.Dense(32, activation="relu"),
                  keras.layers.Dense(CLASSES)]  # fmt: skip
        model = keras.Sequential(layers)
        model, optimizer = dist.setup(model, keras.optimizers.SGD(0.1, momentum=0.9), **settings)
        cross_entropy = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

        @tf.function
        def tape_step(inputs, labels, weight):
            with tf.GradientTape() as tape:
                loss = cross_entropy(labels, model(inputs, training=True)) * weight
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))

        if stepping == "fit":  # each rank's half of each step's batch, in one batch of Keras's fit
            # with XLA, as Keras compiles by itself where a GPU is visible: hvd_train turns it off
            model.compile(optimizer=optimizer, loss=cross_entropy, jit_compile=True)
            passes = [batch for step in range(STEPS) for batch in halves(step, rank, variant)]
            inputs, labels = (np.concatenate(parts) for parts in zip(*passes, strict=True))
            model.fit(inputs, labels, batch_size=BATCH, shuffle=False, verbose=0)
        for step in range(STEPS if stepping != "fit" else 0):
            batches = halves(step, rank, variant)
            if stepping == "passes":  # two applies a step, their gradients added up
                for inputs, labels in batches:
                    tape_step(inputs, labels, tf.constant(0.5))
            else:
                inputs, labels = (np.concatenate(parts) for parts in zip(*batches, strict=True))
                tape_step(inputs, labels, tf.constant(1.0))
        weights = {f"{i}.{v.name}": v.numpy() for i, v in enumerate(model.trainable_variables)}
    dist.check_replicas(f"after the steps of {variant}")
    if dist.is_rank_zero:
        np.savez(out / f"{variant}-{world}.npz", **weights)


framework, out = sys.argv[1], Path(sys.argv[2])
for variant in sys.argv[3:]:
    steps(framework, variant, out)
