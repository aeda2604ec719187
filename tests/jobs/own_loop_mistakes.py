"""Runs alone or inside each rank under `horovodrun -np 2`: one mistake with the own-loop layer,
which must end the job with one line and exit code 2.

usage: own_loop_mistakes.py MISTAKE FRAMEWORK OUTPUT_DIR
"""

import sys

import numpy as np

from hvd_train import Distributed

mistake, framework, output_dir = sys.argv[1:4]


def model_and_optimizer(width: int = 4):
    if framework == "torch":
        import torch

        model = torch.nn.Linear(3, width)
        return model, torch.optim.SGD(model.parameters(), lr=0.1)
    import keras

    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(width)])
    return model, keras.optimizers.SGD(0.1)


def other_frameworks_optimizer():
    if framework == "torch":
        import keras

        return keras.optimizers.SGD(0.1)
    import torch

    return torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)


dist = Distributed(framework)
if mistake == "step-before-setup":
    dist.backward(np.zeros(()))  # a loss, of a model the layer has not set up
elif mistake == "all-reduce-a-string":
    dist.all_reduce("done")
elif mistake == "setup-twice":
    model, optimizer = model_and_optimizer()
    dist.setup(model, optimizer)
    dist.setup(model, optimizer)
elif mistake == "models-differ":
    dist.setup(*model_and_optimizer(width=4 + dist.rank))
elif mistake == "other-frameworks-optimizer":
    dist.setup(model_and_optimizer()[0], other_frameworks_optimizer())
elif mistake in ("save", "load-another-model"):
    model, optimizer = dist.setup(*model_and_optimizer(width=4 if mistake == "save" else 5))
    if mistake == "save":
        dist.save(output_dir, {"model": model, "optimizer": optimizer, "epoch": 1})
    else:
        dist.load(output_dir)
elif mistake == "shard-unshardable":
    model, optimizer = model_and_optimizer()
    if framework == "torch":
        import torch

        optimizer = torch.optim.LBFGS(model.parameters(), lr=0.1)  # its steps see every tensor
    else:
        import keras

        optimizer = keras.optimizers.SGD(0.1, global_clipnorm=1.0)  # over this rank's part
    dist.setup(model, optimizer, shard="optimizer")
elif mistake == "save-other-values":
    model, optimizer = dist.setup(*model_and_optimizer())
    dist.save(output_dir, {"model": model, "optimizer": optimizer, "epoch": dist.rank})
elif mistake in ("backward-twice", "backward-twice-sharded"):  # torch
    import torch

    # Two buckets, the first leaving within the backward pass; the second pass's gradients
    # would join averages on their way: refused, as Horovod refuses it.
    model = torch.nn.Sequential(torch.nn.Linear(3, 1024), torch.nn.Linear(1024, 1100))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    shard = "gradients" if mistake.endswith("sharded") else "none"
    model, optimizer = dist.setup(model, optimizer, overlap=True, shard=shard)
    for _ in range(2):
        dist.backward(model(torch.ones(2, 3)).sum())
    optimizer.step()
elif mistake in ("rate-after-backward", "zero-grad-before-step"):  # torch, sharded
    import torch

    # A layer of 4.5 MB, then a small one: two buckets, one leaving within the backward pass.
    model = torch.nn.Sequential(torch.nn.Linear(3, 1024), torch.nn.Linear(1024, 1100))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = dist.setup(model, optimizer, shard="gradients")
    dist.backward(model(torch.ones(2, 3)).sum())
    if mistake == "rate-after-backward":
        optimizer.param_groups[0]["lr"] = 0.05
        optimizer.step()
    else:
        optimizer.zero_grad()
