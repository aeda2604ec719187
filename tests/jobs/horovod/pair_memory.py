"""Runs inside each rank under `horovodrun -np 2`: allreduces one large float32 tensor (256 MiB)
through the two-rank exchange and prints, as `MEMORY {...}` on rank 0, this process's resident
memory before it and after it, once the tensor and its result are freed. What the exchange keeps
between allreduces shows as the difference."""

import gc
import json

import horovod.torch as hvd
import psutil
import torch

LARGE = 64 << 20  # float32 values: 256 MiB, over Horovod's fusion threshold, so never fused


def resident_mib() -> float:
    gc.collect()
    return psutil.Process().memory_info().rss / 2**20


def main() -> None:
    hvd.init()
    hvd.allreduce(torch.ones(1), name="warm.up")  # Horovod's own threads and buffers
    before = resident_mib()
    result = hvd.allreduce(torch.ones(LARGE), op=hvd.Sum, name="large")
    correct = bool((result == hvd.size()).all())
    del result
    after = resident_mib()
    if hvd.rank() == 0:
        print("MEMORY " + json.dumps({"before": before, "after": after, "correct": correct}))
    hvd.shutdown()


if __name__ == "__main__":
    main()
