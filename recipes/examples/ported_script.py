"""A typical training script, ported: LAMB with its usual parameter groups, a one-cycle
schedule, a validation split with early stopping and the best checkpoint kept, and a callback
that logs each evaluation. Under both frameworks, with each one's own model and optimizer:

    horovodrun -np 2 python -m hvd_train --recipe recipes/examples/ported_script.py
    horovodrun -np 2 python -m hvd_train --recipe recipes/examples/ported_script.py \\
        --framework tensorflow

What the script did by hand, hvd_train does: the learning rate is scaled with the world size
and follows the one-cycle curve (the optimizer's own rate is the one-process peak), the
gradients are averaged over the ranks, the validation split is set aside with the seed, the
early stopping's count and the callback's state survive a resume, and `--resume best` goes back
to the best checkpoint.
"""

import math

from hvd_train import Callback, Checkpoints, Data, Loading, Recipe, Schedule

PEAK_RATE, WEIGHT_DECAY = 0.004, 0.01


def torch_model():
    from torch import nn

    return nn.Sequential(
        nn.Conv2d(1, 32, 3), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(64 * 5 * 5, 128), nn.ReLU(), nn.Linear(128, 10),
    )  # fmt: skip


def keras_model():
    import keras
    from keras import layers

    return keras.Sequential([
        keras.Input((28, 28, 1)),
        layers.Conv2D(32, 3), layers.BatchNormalization(), layers.ReLU(), layers.MaxPooling2D(),
        layers.Conv2D(64, 3), layers.BatchNormalization(), layers.ReLU(), layers.MaxPooling2D(),
        layers.Flatten(), layers.Dense(128, activation="relu"), layers.Dense(10),
    ])  # fmt: skip


def lamb(module=None):
    """LAMB, weight decay on the weight matrices only (not on biases and batchnorm's scales and
    shifts). Under torch `module` is the torch module; Keras's optimizer takes no model."""
    if module is None:
        import keras

        optimizer = keras.optimizers.Lamb(PEAK_RATE, weight_decay=WEIGHT_DECAY)
        optimizer.exclude_from_weight_decay(var_names=["bias", "gamma", "beta"])
        return optimizer
    matrices = [p for p in module.parameters() if p.ndim > 1]
    vectors = [p for p in module.parameters() if p.ndim == 1]
    groups = [{"params": matrices, "weight_decay": WEIGHT_DECAY},
              {"params": vectors, "weight_decay": 0.0}]  # fmt: skip
    return torch_lamb()(groups, lr=PEAK_RATE)


def torch_lamb():
    """torch has no LAMB of its own: You et al., 2019 (arXiv:1904.00962), Algorithm 2, with
    Adam's bias correction, as Keras's Lamb computes it."""
    import torch

    class Lamb(torch.optim.Optimizer):
        def __init__(self, params, lr, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.0):
            super().__init__(params, {"lr": lr, "betas": betas, "eps": eps,
                                      "weight_decay": weight_decay})  # fmt: skip

        @torch.no_grad()
        def step(self, closure=None):
            for group in self.param_groups:
                beta1, beta2 = group["betas"]
                for p in group["params"]:
                    if p.grad is None:
                        continue
                    state = self.state[p]
                    if not state:
                        state["step"] = torch.zeros(())
                        state["m"], state["v"] = torch.zeros_like(p), torch.zeros_like(p)
                    state["step"] += 1
                    m, v, t = state["m"], state["v"], float(state["step"])
                    m.mul_(beta1).add_(p.grad, alpha=1 - beta1)
                    v.mul_(beta2).addcmul_(p.grad, p.grad, value=1 - beta2)
                    update = (m / (1 - beta1**t)) / ((v / (1 - beta2**t)).sqrt() + group["eps"])
                    update.add_(p, alpha=group["weight_decay"])
                    weights, steps = p.norm(), update.norm()
                    trust = weights / steps if weights > 0 and steps > 0 else 1.0
                    p.add_(update, alpha=-group["lr"] * float(trust))

    return Lamb


class EvaluationLog(Callback):
    """Rank 0 prints each evaluation, as the script's own logging did; it counts them, and the
    count goes on after a resume."""

    def __init__(self):
        self.evaluations = 0

    def on_evaluate(self, state, metrics):
        self.evaluations += 1
        if state.rank == 0 and "val_accuracy" in metrics:
            rate, accuracy = state.metrics.get("learning_rate", math.nan), metrics["val_accuracy"]
            print(f"evaluation {self.evaluations} at step {state.step}: val accuracy "
                  f"{accuracy:.2%}, learning rate {rate:.2e}", flush=True)  # fmt: skip

    def state_dict(self):
        return {"evaluations": self.evaluations}

    def load_state_dict(self, state):
        self.evaluations = state["evaluations"]


recipe = Recipe(
    data=Data("mnist"),
    torch_model=torch_model,
    keras_model=keras_model,
    optimizer=lamb,
    loading=Loading(validation_fraction=0.1),
    schedule=Schedule(
        epochs=3,
        batch_size=64,
        decay={"type": "one_cycle", "pct_start": 0.25},
        evaluate_every=200,
        early_stopping={"monitor": "val_accuracy", "mode": "max", "patience": 4},
    ),
    checkpoints=Checkpoints(keep_best=1, monitor="val_accuracy", mode="max"),
    callbacks=[EvaluationLog()],
)
