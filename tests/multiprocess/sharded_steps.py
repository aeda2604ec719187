"""Runs inside each rank under `horovodrun -np N`: the same steps of a small convolutional model
(channels-last, gradients in several buckets) under each `shard` setting, in one process, for
each case below; rank 0 saves the weights and the whole optimizer state each setting ended
with into OUT/<case>-<shard>.npz (for one case, also what a loop sharding another way loaded
from its checkpoint, OUT/<case>-<shard>-reloaded.npz), and prints `SHARDED {json}`: per case,
the parameters each rank's optimizer held (whole or in pieces).

usage: sharded_steps.py OUT [CASE ...]
"""

import json
import sys
from pathlib import Path

import numpy as np
import torch
from torch import nn

from hvd_train import Distributed

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "recipes" / "examples"))
from ported_script import torch_lamb

STEPS = 4
# Each case: the optimizer, and the setup's settings beside shard.
CASES = {
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


# The case whose run is saved and loaded into a loop sharding the NEXT way.
RELOADED = "adamw"
NEXT = {"none": "optimizer", "optimizer": "gradients", "gradients": "none"}


def model() -> nn.Module:
    torch.manual_seed(0)
    layers = [nn.Conv2d(1, 8, 3), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 26 * 26, 257), nn.ReLU(),
              nn.Linear(257, 10)]  # fmt: skip
    return nn.Sequential(*layers).to(memory_format=torch.channels_last)


def run(case: str, shard: str, out: Path) -> list[list[int]]:
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
    return [list(p.shape) for p in held]


def keep(dist: Distributed, path: Path) -> None:
    """The weights and the whole optimizer state, into `path` on rank 0 (every rank calls it:
    sharded, the state is gathered onto rank 0)."""
    state = dist.state()
    if dist.is_rank_zero:
        weights = {f"weight.{k}": v for k, v in state.weights.items()}
        optimizer_state = {f"optimizer.{k}": v for k, v in state.optimizer.items()}
        np.savez(path, **weights, **optimizer_state)


def main() -> None:
    out, cases = Path(sys.argv[1]), sys.argv[2:] or list(CASES)
    held = {}
    for case in cases:
        for shard in ("none", "optimizer", "gradients"):
            held[f"{case}-{shard}"] = run(case, shard, out)
    dist = Distributed("torch")
    everyone = dist.all_gather(held)
    dist.print("SHARDED " + json.dumps(everyone))


if __name__ == "__main__":
    main()
