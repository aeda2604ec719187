"""Runs inside each rank under `horovodrun -np N`: the torch backend's `Exchange` (gradients as
views of one flat buffer, averaged in place) against the exchange it replaced (each gradient
its own tensor, in one group that Horovod copies into its fusion buffer and back), on the same
gradients, in the same order.

usage: exchange_bits.py TRAVEL OVERLAP   (TRAVEL: none, bf16; OVERLAP: 0 or 1)
Prints `EXCHANGE {json}` on rank 0: how many buckets the model's gradients made, which
parameters' averages differ in any bit from the reference's, and whether the control values
came back averaged (carried in the gradients' buffer, or on their own).
"""

import json
import sys

import horovod.torch as hvd
import numpy as np
import torch
from torch import nn

from hvd_train.distributed.torch.exchange import TRAVEL_DTYPES, FlatExchange


def main() -> None:
    travel, overlap = TRAVEL_DTYPES[sys.argv[1]], sys.argv[2] == "1"
    hvd.init()
    torch.manual_seed(0)  # the same model everywhere; each rank its own data below
    model = nn.Sequential(*[nn.Linear(700, 700) for _ in range(6)], nn.Linear(700, 3))
    parameters = list(model.parameters())
    exchange = FlatExchange(parameters, travel, torch.device("cpu"), passes=1, overlap=overlap,
                        exchanges=True)  # fmt: skip
    torch.manual_seed(1 + hvd.rank())
    x, y = torch.randn(32, 700), torch.randint(0, 3, (32,))
    gradients = torch.autograd.grad(nn.functional.cross_entropy(model(x), y), parameters)
    # The reference: the exchange before this one, in the flat buffer's order, with the
    # control values last in the group where they travel with the gradients.
    order = [index for bucket in exchange.buckets for index in bucket]
    sent = [gradients[i] if travel is None else gradients[i].to(travel) for i in order]
    control = np.arange(5, dtype=np.float64)  # a step's flags and loss
    tail = [torch.zeros(len(exchange.control))] if exchange.carries_control else []
    averages = hvd.grouped_allreduce([*sent, *tail], op=hvd.Average, name="reference")
    reference = {i: a.to(gradients[i].dtype) for i, a in zip(order, averages, strict=False)}
    nn.functional.cross_entropy(model(x), y).backward()
    averaged = exchange.synchronize(control * (1 + hvd.rank()))
    differing = [i for i, p in enumerate(parameters) if not torch.equal(p.grad, reference[i])]
    views = all(p.grad is v for p, v in zip(parameters, exchange.views, strict=True))
    # Rank r sent (1 + r) times the values: their average is exact in float32.
    control_right = averaged.tolist() == (control * (1 + (hvd.size() - 1) / 2)).tolist()
    if hvd.rank() == 0:
        record = {"buckets": len(exchange.buckets), "differing": differing, "views": views,
                  "control": control_right, "carried": exchange.carries_control}  # fmt: skip
        print("EXCHANGE " + json.dumps(record), flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
