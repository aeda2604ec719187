"""Runs inside each rank for `python -m benchmarks.memory state`: a model of about 100 M
parameters (12 blocks of two layers, 1024 -> 4096 -> 1024) under AdamW through the own-loop
layer, `shard` as asked, a few steps, then a checkpoint; rank 0 prints `STATE {json}`: per
rank, its peak resident memory after the steps and after saving, and the bytes of training
state it holds (weights, gradients, optimizer state).

usage: sharded_model.py SHARD OUTPUT_DIR [STEPS]
"""

import json
import resource
import sys

import torch
from torch import nn

from hvd_train import Distributed

WIDTH, BLOCKS, BATCH = 1024, 12, 4


def main() -> None:
    shard, output = sys.argv[1], sys.argv[2]
    steps = int(sys.argv[3]) if len(sys.argv) > 3 else 3
    dist = Distributed("torch")
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
    training = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    dist.save(output, {"model": model, "optimizer": optimizer, "epoch": 1})
    exchange = dist.backend.exchange
    state = [value for entries in optimizer.state.values() for value in entries.values()]
    held = {
        "parameters": sum(p.numel() for p in model.parameters()),
        "weights": sum(p.numel() * p.element_size() for p in model.parameters()),
        "gradients": exchange.gradients.numel() * exchange.gradients.element_size(),
        "optimizer": sum(v.numel() * v.element_size() for v in state if torch.is_tensor(v)),
        "peak_training": training,
        "peak_saving": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    }
    dist.print("STATE " + json.dumps(dist.all_gather(held)))


if __name__ == "__main__":
    main()
