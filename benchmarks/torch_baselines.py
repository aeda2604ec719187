"""The same model under PyTorch, trained three other ways:

    python torch_baselines.py plain RECIPE STEPS                 one process, no Horovod
    python torch_baselines.py alternate RECIPE STEPS             that loop and hvd_train's step
                                                                 taking turns in one process
    horovodrun -np 2 python torch_baselines.py horovod ...       a hand-written Horovod loop
    torchrun --nproc-per-node 2 torch_baselines.py ddp ...       torch's DistributedDataParallel
    torchrun --nproc-per-node 2 torch_baselines.py ddp_bf16 ...  the same, gradients sent as bf16
                                                                 (torch's bf16_compress_hook)
    torchrun --nproc-per-node 2 torch_baselines.py zero ...      DDP with torch's
                                                                 ZeroRedundancyOptimizer (ZeRO-1)
    torchrun --nproc-per-node 2 torch_baselines.py fsdp2 ...     FSDP2 (fully_shard, no reshard
                                                                 after forward: ZeRO-2)

Threads: $THREADS per process (default: the cores shared out among the processes).
"""

from __future__ import annotations

import os
import sys

import torch
import torch.nn.functional as F

from benchmarks.common import alternate, measure, report, setup
from hvd_train.builders.torch_layers import build_neutral

WARMUP = 10


def model_of(recipe):
    """The recipe's torch module, as hvd_train makes it."""
    if recipe.torch_model is not None:
        return recipe.torch_model()
    return build_neutral(recipe.layers, recipe.data.input_shape).model


def optimizer_of(recipe):
    """The recipe's optimizer class and settings, in torch's fused form, as hvd_train makes it."""
    settings = recipe.optimizer
    if settings.name == "sgd":
        return torch.optim.SGD, {"lr": settings.learning_rate, "momentum": settings.momentum,
                                 "fused": True}  # fmt: skip
    return torch.optim.Adam, {"lr": settings.learning_rate, "fused": True}


def model_and_optimizer(recipe):
    model = model_of(recipe)
    kind, settings = optimizer_of(recipe)
    return model, kind(model.parameters(), **settings)


def tensors(x, y):
    return torch.from_numpy(x).permute(0, 3, 1, 2), torch.from_numpy(y)


def training_step(model, optimizer):
    def step(x, y):
        inputs, labels = tensors(x, y)
        optimizer.zero_grad()
        F.cross_entropy(model(inputs), labels).backward()
        optimizer.step()

    return step


def plain_step(recipe):
    return training_step(*model_and_optimizer(recipe))


def plain(recipe, train, steps: int) -> float:
    return measure(plain_step(recipe), train, recipe.schedule.batch_size, 0, 1, steps, WARMUP)


def horovod(recipe, train, steps: int) -> float:
    """Horovod's own examples' loop: DistributedOptimizer, broadcast from rank 0."""
    import horovod.torch as hvd

    hvd.init()
    model, optimizer = model_and_optimizer(recipe)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    step = training_step(model, optimizer)

    def barrier():
        hvd.allreduce(torch.zeros(1), name="barrier")

    return measure(step, train, recipe.schedule.batch_size, hvd.rank(), hvd.size(), steps,
                   WARMUP, barrier)  # fmt: skip


def ddp_step(recipe, bf16: bool):
    """Gloo's process group, the recipe's model under DistributedDataParallel (its default
    buckets; with `bf16`, torch's bf16 hook) and its training step."""
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import bf16_compress_hook

    dist.init_process_group("gloo")
    model, optimizer = model_and_optimizer(recipe)
    model = torch.nn.parallel.DistributedDataParallel(model)
    if bf16:
        # Under another name: DDP refuses torch's own hook by its name off CUDA and NCCL, though
        # Gloo reduces bfloat16 on CPU.
        model.register_comm_hook(None, lambda state, bucket: bf16_compress_hook(state, bucket))
    return model, training_step(model, optimizer)


def zero_step(recipe):
    """DDP (default buckets) with torch's ZeroRedundancyOptimizer: each rank keeps the
    optimizer state of its part of the parameters, updates those and broadcasts them."""
    import torch.distributed as dist
    from torch.distributed.optim import ZeroRedundancyOptimizer

    dist.init_process_group("gloo")
    model = model_of(recipe)
    kind, settings = optimizer_of(recipe)
    optimizer = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=kind, **settings)
    model = torch.nn.parallel.DistributedDataParallel(model)
    return model, training_step(model, optimizer)


def fsdp2_step(recipe):
    """FSDP2: each residual block, then the whole model, under `fully_shard` with no reshard
    after the forward pass (parameters gathered once a step, gradients reduce-scattered:
    ZeRO-2, FSDP's SHARD_GRAD_OP)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    model = model_of(recipe)
    for block in model.children():
        if any(True for _ in block.children()):  # ResNet's residual blocks
            fully_shard(block, mesh=mesh, reshard_after_forward=False)
    fully_shard(model, mesh=mesh, reshard_after_forward=False)
    # DTensor has no sharding rule for the fused kernels (torch 2.13): the foreach form.
    kind, settings = optimizer_of(recipe)
    settings = {**settings, "fused": False}
    return model, training_step(model, kind(model.parameters(), **settings))


def sharded(recipe, train, steps: int, make) -> float:
    """A torch sharding system's images/s (`make`: zero_step or fsdp2_step), under torchrun."""
    import torch.distributed as dist

    _, step = make(recipe)
    result = measure(step, train, recipe.schedule.batch_size, dist.get_rank(),
                     dist.get_world_size(), steps, WARMUP, dist.barrier)  # fmt: skip
    dist.destroy_process_group()
    return result


def ddp(recipe, train, steps: int, bf16: bool = False) -> tuple[float, float]:
    """DistributedDataParallel on Gloo, started by torchrun; with `bf16`, each bucket sent as
    bf16 by torch's own communication hook. Its images/s, and then the same steps under
    `no_sync` (nothing sent: DDP's own limit, as hvd-train bench's local phase is hvd_train's)."""
    import torch.distributed as dist

    model, step = ddp_step(recipe, bf16)

    def local_step(x, y):
        with model.no_sync():
            step(x, y)

    rank, world = dist.get_rank(), dist.get_world_size()
    batch = recipe.schedule.batch_size
    result = measure(step, train, batch, rank, world, steps, WARMUP, dist.barrier)
    local = measure(local_step, train, batch, rank, world, steps, WARMUP, dist.barrier)
    dist.destroy_process_group()
    return result, local


if __name__ == "__main__":
    mode, recipe_name, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
    processes = int(os.environ.get("WORLD_SIZE") or os.environ.get("HOROVOD_SIZE") or 1)
    rank = int(os.environ.get("RANK") or os.environ.get("HOROVOD_RANK") or 0)
    threads = int(os.environ.get("THREADS") or max(1, len(os.sched_getaffinity(0)) // processes))
    torch.set_num_threads(threads)
    recipe, train = setup(recipe_name)
    if mode == "alternate":
        hvd_train, plain_loop = alternate("torch", recipe, plain_step(recipe), train, steps, WARMUP)
        report("hvd_train torch and a plain loop, taking turns", processes, threads, hvd_train,
               plain_images_per_second=plain_loop)  # fmt: skip
    else:
        run = {"plain": plain, "horovod": horovod, "ddp": ddp,
               "ddp_bf16": lambda *args: ddp(*args, bf16=True),
               "zero": lambda *args: sharded(*args, zero_step),
               "fsdp2": lambda *args: sharded(*args, fsdp2_step)}[mode]  # fmt: skip
        images_per_second, more = run(recipe, train, steps), {}
        if mode.startswith("ddp"):
            images_per_second, local = images_per_second
            more["local_images_per_second"] = local
        if rank == 0:
            name = {"plain": "torch, plain loop", "horovod": "torch, hand-written Horovod loop",
                    "ddp": "torch DDP (Gloo, torchrun)",
                    "ddp_bf16": "torch DDP (Gloo, torchrun), bf16 hook",
                    "zero": "torch DDP, ZeroRedundancyOptimizer (Gloo, torchrun)",
                    "fsdp2": "torch FSDP2, no reshard after forward (Gloo)"}[mode]  # fmt: skip
            report(name, processes, threads, images_per_second, **more)
        if mode in ("ddp", "ddp_bf16", "zero", "fsdp2"):
            # torch 2.13's Gloo threads aborted the interpreter's exit ("terminate called without
            # an active exception") in 2 of 18 runs, after destroy_process_group and the result.
            sys.stdout.flush()
            os._exit(0)
