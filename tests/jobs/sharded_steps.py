"""Runs inside each rank under `horovodrun -np N`: the same steps of a small convolutional model
(channels-last, gradients in several buckets) under each `shard` setting, in one process, for
each case below; rank 0 saves the weights and the whole optimizer state each setting ended
with into OUT/<case>-<shard>.npz (for one case, also what a loop sharding another way loaded
from its checkpoint, OUT/<case>-<shard>-reloaded.npz), and prints `SHARDED {json}`: per case,
the parameters each rank's optimizer held (whole or in pieces), and which of them were copies
of the model's (`<case>-<shard>-copies`: under TensorFlow, the runs of parameters it splits);
under TensorFlow also the kinds of Horovod op in the loop's traced step
(`<case>-<shard>-sent`).

Under torch every case is a loop's own steps (`backward`, `optimizer.step()`); under TensorFlow
the loop's own `GradientTape` step for "adamw" and "adam-fp16-mixed" (where, in its second
step, rank 0 makes one gradient of a parameter it alone updates overflow: every rank must skip
that step, as unsharded), `train_step` (a recipe's compiled step) for the others.

usage: sharded_steps.py FRAMEWORK OUT [CASE ...]
"""

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

from hvd_train import Distributed, Optimizer

FRAMEWORK = sys.argv[1]
if FRAMEWORK == "torch":
    import torch
    from torch import nn

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "recipes" / "examples"))
    from ported_script import torch_lamb
else:
    import keras
    import tensorflow as tf

STEPS = 4
# Each case: the optimizer, and the setup's settings beside shard.
TORCH_CASES = {
    "adamw": (lambda p: torch.optim.AdamW(p, lr=1e-3, weight_decay=0.01, fused=True),
              {"overlap": True}),
    "sgd-accumulated": (lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, nesterov=True,
                                                  weight_decay=1e-4),
                        {"overlap": False, "backward_passes_per_step": 2}),
    "rmsprop-bf16": (lambda p: torch.optim.RMSprop(p, lr=1e-3, momentum=0.9, foreach=True),
                     {"overlap": True, "compression": "bf16"}),
    "adam-fp16-mixed": (lambda p: torch.optim.Adam(p, lr=1e-3), {"precision": "fp16-mixed"}),
    "lamb": (lambda p: torch_lamb()(p, lr=1e-3, weight_decay=0.01), {"overlap": True}),
    "sgd-clipped": (lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9),
                    {"gradient_clip_norm": 0.5}),
}  # fmt: skip
# The same under TensorFlow; sgd through hvd_train's table, whose L2 term the step adds.
TENSORFLOW_CASES = {
    "adamw": (lambda: keras.optimizers.AdamW(1e-3, weight_decay=0.01), {"overlap": True}),
    "sgd-accumulated": (lambda: Optimizer(name="sgd", learning_rate=0.05, momentum=0.9,
                                          nesterov=True, weight_decay=1e-4),
                        {"overlap": False, "backward_passes_per_step": 2}),
    "rmsprop-bf16": (lambda: keras.optimizers.RMSprop(1e-3, momentum=0.9),
                     {"overlap": True, "compression": "bf16"}),
    "adam-fp16-mixed": (lambda: keras.optimizers.Adam(1e-3), {"precision": "fp16-mixed"}),
    "lamb": (lambda: keras.optimizers.Lamb(1e-3, weight_decay=0.01), {"overlap": True}),
    "sgd-clipped": (lambda: keras.optimizers.SGD(0.05, momentum=0.9),
                    {"gradient_clip_norm": 0.5}),
}  # fmt: skip
CASES = TORCH_CASES if FRAMEWORK == "torch" else TENSORFLOW_CASES


# The case whose run is saved and loaded into a loop sharding the NEXT way.
RELOADED = "adamw"
NEXT = {"none": "optimizer", "optimizer": "gradients", "gradients": "none"}


# Every model also holds a parameter that no step reaches (a head left out of the forward
# pass), each of its elements UNUSED: plain torch and Keras skip it, so it keeps that value.
UNUSED = 0.5


def model() -> Any:
    if FRAMEWORK == "tensorflow":
        keras.utils.set_random_seed(0)
        return WithUnused([keras.layers.Conv2D(8, 3), keras.layers.ReLU(),
                           keras.layers.Flatten(), keras.layers.Dense(257), keras.layers.ReLU(),
                           keras.layers.Dense(10)])  # fmt: skip
    torch.manual_seed(0)
    layers = [nn.Conv2d(1, 8, 3), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 26 * 26, 257), nn.ReLU(),
              nn.Linear(257, 10)]  # fmt: skip
    net = nn.Sequential(*layers).to(memory_format=torch.channels_last)
    net.register_parameter("unused", nn.Parameter(torch.full((5, 3), UNUSED)))
    return net


if FRAMEWORK == "tensorflow":

    class WithUnused(keras.Model):
        """`layers` in turn, and a Dense layer built beside them that no call reaches."""

        def __init__(self, layers: list[Any]) -> None:
            super().__init__()
            unused = keras.initializers.Constant(UNUSED)
            self.unused = keras.layers.Dense(3, kernel_initializer=unused, bias_initializer=unused)
            self.body = keras.Sequential(layers)
            self.unused.build((None, 5))
            self.body.build((None, 28, 28, 1))
            self.built = True

        def call(self, x: Any) -> Any:
            return self.body(x)


Held = tuple[list[list[int]], list[list[int]]]  # the tensors' shapes, and the copies'
# Under TensorFlow, the Horovod ops in the loop's own step, by "<case>-<shard>".
SENT: dict[str, list[str]] = {}


def run(case: str, shard: str, out: Path) -> Held:
    if FRAMEWORK == "tensorflow":
        return run_tensorflow(case, shard, out)
    make, settings = CASES[case]
    dist = Distributed("torch")
    net = model()
    net, optimizer = dist.setup(net, make(net.parameters()), shard=shard, **settings)
    passes = settings.get("backward_passes_per_step", 1)
    rng = np.random.default_rng(dist.rank)  # each rank its own batches
    for _ in range(STEPS):
        optimizer.zero_grad()
        for _ in range(passes):
            x = torch.from_numpy(rng.standard_normal((8, 1, 28, 28)).astype(np.float32))
            y = torch.from_numpy(rng.integers(0, 10, 8))
            dist.backward(nn.functional.cross_entropy(net(x), y))
        optimizer.step()
    keep(dist, out / f"{case}-{shard}.npz")
    if case == RELOADED:  # saved, then loaded by a loop that shards another way
        dist.save(out / f"{case}-{shard}", {"model": net, "optimizer": optimizer, "epoch": 1})
        other = Distributed("torch")
        again = model()
        again, _ = other.setup(again, make(again.parameters()), shard=NEXT[shard], **settings)
        other.load(out / f"{case}-{shard}")
        keep(other, out / f"{case}-{shard}-reloaded.npz")
    held = [p for group in optimizer.param_groups for p in group["params"]]
    return [list(p.shape) for p in held], []  # views of the parameters


def run_tensorflow(case: str, shard: str, out: Path) -> Held:
    make, settings = CASES[case]
    settings = dict(settings)
    dist = Distributed("tensorflow", precision=settings.pop("precision", "fp32"))
    net, optimizer = dist.setup(model(), make(), shard=shard, **settings)
    passes = settings.get("backward_passes_per_step", 1)
    rng = np.random.default_rng(dist.rank)  # each rank its own batches

    @tf.function
    def own_step(x: tf.Tensor, y: tf.Tensor, overflow: tf.Tensor) -> None:
        with tf.GradientTape() as tape:
            logits = tf.cast(net(x, training=True), tf.float32)
            loss = tf.reduce_mean(
                keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True)
            )
            scaled = optimizer.scale_loss(loss)
        *grads, last = tape.gradient(scaled, net.trainable_variables)
        grads.append(last + overflow)  # the last bias: rank 0's alone, at np=2
        optimizer.apply_gradients(zip(grads, net.trainable_variables, strict=True))

    for step in range(STEPS):
        batches = [(rng.standard_normal((8, 28, 28, 1)).astype(np.float32),
                    rng.integers(0, 10, 8)) for _ in range(passes)]  # fmt: skip
        if case in (RELOADED, "adam-fp16-mixed"):
            overflow = np.zeros(10, np.float32)
            if case != RELOADED and step == 1 and dist.rank == 0:
                overflow[3] = np.inf
            own_step(*batches[0], overflow)
        else:
            dist.exchange.step(batches, dist.learning_rate, seed=step)
    keep(dist, out / f"{case}-{shard}.npz")
    if case == RELOADED:  # saved, then loaded by a loop that shards another way
        graph = own_step.get_concrete_function(*batches[0], overflow).graph
        SENT[f"{case}-{shard}"] = sorted({op.type for op in graph.get_operations()
                                          if op.type.startswith("Horovod")})  # fmt: skip
        dist.save(out / f"{case}-{shard}", {"model": net, "optimizer": optimizer, "epoch": 1})
        other = Distributed("tensorflow")
        other.setup(model(), make(), shard=NEXT[shard], **settings)
        other.load(out / f"{case}-{shard}")
        keep(other, out / f"{case}-{shard}-reloaded.npz")
    shards = dist.environment.backend.exchange.shards
    held = net.trainable_variables if shards is None else shards.tensors
    own = {id(v) for v in net.trainable_variables}
    held = [v for v in held if np.prod(v.shape) > 0]
    return [list(v.shape) for v in held], [list(v.shape) for v in held if id(v) not in own]


def keep(dist: Distributed, path: Path) -> None:
    """The weights and the whole optimizer state, into `path` on rank 0 (every rank calls it:
    sharded, the state is gathered onto rank 0)."""
    state = dist.exchange.state()
    if dist.is_rank_zero:
        weights = {f"weight.{k}": v for k, v in state.weights.items()}
        optimizer_state = {f"optimizer.{k}": v for k, v in state.optimizer.items()}
        np.savez(path, **weights, **optimizer_state)


def main() -> None:
    out, cases = Path(sys.argv[2]), sys.argv[3:] or list(CASES)
    held = {}
    for case in cases:
        for shard in ("none", "optimizer", "gradients"):
            held[f"{case}-{shard}"], held[f"{case}-{shard}-copies"] = run(case, shard, out)
            if f"{case}-{shard}" in SENT:
                held[f"{case}-{shard}-sent"] = SENT[f"{case}-{shard}"]
    dist = Distributed(FRAMEWORK)
    everyone = dist.all_gather(held)
    dist.print("SHARDED " + json.dumps(everyone))


if __name__ == "__main__":
    main()
