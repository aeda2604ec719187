"""Runs inside each rank for `python -m benchmarks.memory state`: a model of about 100 M
parameters (12 blocks of two layers, 1024 -> 4096 -> 1024) under AdamW through the own-loop
layer, in FRAMEWORK, `shard` as asked, a few steps, then a checkpoint; rank 0 prints
`STATE {json}`: per rank, its peak resident memory after the steps and after saving, and the
bytes of training state it holds (weights, with TensorFlow's copies of its runs of the
parameters it splits; gradients; optimizer state).

usage: sharded_model.py FRAMEWORK SHARD OUTPUT_DIR [STEPS]
"""

import json
import resource
import sys
from typing import Any

import numpy as np

from hvd_train import Distributed

WIDTH, BLOCKS, BATCH = 1024, 12, 4


def torch_steps(dist: Distributed, shard: str, steps: int) -> tuple[Any, Any, dict[str, int]]:
    import torch
    from torch import nn

    torch.manual_seed(0)
    blocks = [nn.Sequential(nn.Linear(WIDTH, 4 * WIDTH), nn.Linear(4 * WIDTH, WIDTH))
              for _ in range(BLOCKS)]  # fmt: skip
    model = nn.Sequential(*blocks)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)
    model, optimizer = dist.setup(model, optimizer, shard=shard)
    for step in range(steps):
        x = torch.randn(BATCH, WIDTH, generator=torch.Generator().manual_seed(step + dist.rank))
        optimizer.zero_grad()
        dist.backward(model(x).square().mean())
        optimizer.step()
    gradients = dist.environment.backend.exchange.gradients
    state = [value for entries in optimizer.state.values() for value in entries.values()]
    held = {
        "parameters": sum(p.numel() for p in model.parameters()),
        "weights": sum(p.numel() * p.element_size() for p in model.parameters()),
        "gradients": gradients.numel() * gradients.element_size(),
        "optimizer": sum(v.numel() * v.element_size() for v in state if torch.is_tensor(v)),
    }
    return model, optimizer, held


def tensorflow_steps(dist: Distributed, shard: str,
                     steps: int) -> tuple[Any, Any, dict[str, int]]:  # fmt: skip
    import keras
    import tensorflow as tf

    keras.utils.set_random_seed(0)
    layers = [keras.layers.Dense(width) for _ in range(BLOCKS) for width in (4 * WIDTH, WIDTH)]
    model = keras.Sequential([keras.Input((WIDTH,)), *layers])
    optimizer = keras.optimizers.AdamW(1e-4, weight_decay=0.01)
    model, optimizer = dist.setup(model, optimizer, shard=shard)

    @tf.function
    def step(x: tf.Tensor) -> None:
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(x, training=True)))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))

    for number in range(steps):
        rng = np.random.default_rng(number + dist.rank)
        step(rng.standard_normal((BATCH, WIDTH)).astype(np.float32))

    def size(variables: list[Any]) -> int:
        return sum(int(np.prod(v.shape)) * np.dtype(v.dtype).itemsize for v in variables)

    variables = model.trainable_variables
    shards = dist.environment.backend.exchange.shards
    pieces = [] if shards is None else [shards.tensors[index] for index in shards.pieces]
    copies = [] if shards is None else [shards.tensors[index] for index in shards.split
                                        if index in shards.pieces]  # fmt: skip
    held = {
        "parameters": sum(int(np.prod(v.shape)) for v in variables),
        "weights": size(variables) + size(copies),
        "gradients": size(pieces if shards is not None and shards.hold_back else variables),
        "optimizer": size(optimizer.variables),
    }
    return model, optimizer, held


def main() -> None:
    framework, shard, output = sys.argv[1:4]
    steps = int(sys.argv[4]) if len(sys.argv) > 4 else 3
    dist = Distributed(framework)
    run = torch_steps if framework == "torch" else tensorflow_steps
    model, optimizer, held = run(dist, shard, steps)
    held["peak_training"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    dist.save(output, {"model": model, "optimizer": optimizer, "epoch": 1})
    held["peak_saving"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    dist.print("STATE " + json.dumps(dist.all_gather(held)))


if __name__ == "__main__":
    main()
