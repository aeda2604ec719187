"""The bytes a training step copies: hvd_train's torch exchange against DDP's.

    python -m benchmarks.copies [--recipe resnet18] [--steps 3]

Two ranks on this host, one thread each, on synthetic data of the recipe's shape, train one
system after another; rank 0 counts what its steps copied, over --steps steps after two of
warmup:

  torch     the bytes written by `aten::copy_`, through which every cast, clone and bucket
            copy goes, from torch's profiler
  horovod   the bytes Horovod copied into its fusion buffer and out again, from its timeline
            (hvd_train only: DDP does not use Horovod)

The systems: hvd_train with overlap off and on, and with compression=bf16 (overlap on); DDP
with its default buckets, and with torch's bf16_compress_hook; and, for what the passes copy by
themselves, the plain loop of `benchmarks.torch_baselines` in one process, which exchanges
nothing. Each system's `exchange_mb` is its total over the plain loop's. The figures do not
depend on the link, so `benchmarks.links` takes them from here. Prints one JSON object: MB per
step by system. Why these copies matter: docs/performance.md, "Gradients in place".
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.run import BIN, PYTHON, ROOT, results

WARMUP = 2
# What torch's profiler calls each dtype, and its bytes.
ITEM_BYTES = {"float": 4, "double": 8, "c10::Half": 2, "c10::BFloat16": 2, "long int": 8,
              "int": 4, "unsigned char": 1, "bool": 1}  # fmt: skip
HOROVOD_ITEM_BYTES = {"float32": 4, "float64": 8, "float16": 2, "bfloat16": 2}
SYSTEMS = {  # name: (launcher, the worker's system, overrides)
    "plain": ("python", "plain", []),
    "hvd_train_no_overlap": ("horovodrun", "hvd_train", ["overlap=false"]),
    "hvd_train": ("horovodrun", "hvd_train", ["overlap=true"]),
    "hvd_train_bf16": ("horovodrun", "hvd_train", ["overlap=true", 'compression="bf16"']),
    "ddp": ("torchrun", "ddp", []),
    "ddp_bf16": ("torchrun", "ddp_bf16", []),
}
ONE_THREAD = {"HVD_TRAIN_THREADS": "1", "THREADS": "1", "OMP_NUM_THREADS": "1"}


def torch_copies(step, batches) -> float:
    """The bytes `aten::copy_` wrote per step, over `batches` after WARMUP steps."""
    from torch.profiler import profile

    for x, y in batches[:WARMUP]:
        step(x, y)
    with profile(record_shapes=True) as profiled:
        for x, y in batches[WARMUP:]:
            step(x, y)
    copies = [e for e in profiled.events() if e.name == "aten::copy_"]
    written = sum(int(np.prod(e.input_shapes[0])) * ITEM_BYTES[e.input_dtypes[0]] for e in copies)
    return written / (len(batches) - WARMUP)


def horovod_copies(timeline: Path, steps: int) -> float:
    """The bytes per step that the steps' allreduces (named hvd_train.step and
    hvd_train.control) copied into Horovod's fusion buffer and out again, from its timeline:
    per tensor, each MEMCPY_IN/OUT_FUSION_BUFFER activity counts the tensor's bytes once."""
    text = timeline.read_text().rstrip().rstrip(",")
    events = json.loads(text if text.endswith("]") else text + "]")
    names: dict[int, str] = {}
    copies: dict[int, int] = {}  # per tensor: its copies in the operation going on
    copied = 0
    for event in events:
        pid = event.get("pid")
        if event.get("name") == "process_name" and "name" in event.get("args", {}):
            names[pid] = event["args"]["name"]
        elif event.get("ph") == "B" and "FUSION_BUFFER" in event.get("name", ""):
            copies[pid] = copies.get(pid, 0) + event["name"].startswith("MEMCPY")
        elif event.get("ph") == "E" and "shape" in event.get("args", {}):
            shape = json.loads(event["args"]["shape"])
            size = int(np.prod(shape)) * HOROVOD_ITEM_BYTES.get(event["args"]["dtype"], 0)
            if "hvd_train.step" in names[pid] or "hvd_train.control" in names[pid]:
                copied += size * copies.get(pid, 0)
            copies[pid] = 0
    return copied / steps


def hvd_train_worker(recipe_name: str, steps: int, overrides: list[str]) -> dict[str, float]:
    from benchmarks.common import batches
    from hvd_train.commands.bench import bench_recipe
    from hvd_train.recipe import load_data
    from hvd_train.training.run import open_run

    settings = dict(setting.split("=", 1) for setting in overrides)
    settings = {key: json.loads(value) for key, value in settings.items()}
    recipe = bench_recipe(recipe_name, "torch", settings, synthetic=True)
    dist = open_run("torch", recipe, seed=0).dist
    train = load_data(recipe, None).train
    batch, flags = recipe.schedule.batch_size, np.zeros(2)
    taken = list(batches(train, batch, dist.rank, dist.world_size, WARMUP + steps))
    index = iter(range(len(taken)))
    copied = torch_copies(lambda x, y: dist.exchange.step([(x, y)], 1e-4, next(index), flags),
                          taken)  # fmt: skip
    parameters = dist.environment.backend.exchange.parameters
    gradient_bytes = sum(p.numel() * p.element_size() for p in parameters)
    return {"torch_bytes": copied, "gradient_bytes": gradient_bytes}


def plain_worker(recipe_name: str, steps: int) -> dict[str, float]:
    from benchmarks.common import batches, setup
    from benchmarks.torch_baselines import plain_step

    recipe, train = setup(recipe_name)
    taken = list(batches(train, recipe.schedule.batch_size, 0, 1, WARMUP + steps))
    return {"torch_bytes": torch_copies(plain_step(recipe), taken)}


def ddp_worker(recipe_name: str, steps: int, bf16: bool) -> dict[str, float]:
    import torch.distributed as dist

    from benchmarks.common import batches, setup
    from benchmarks.torch_baselines import ddp_step

    recipe, train = setup(recipe_name)
    _, step = ddp_step(recipe, bf16)
    rank, world = dist.get_rank(), dist.get_world_size()
    taken = list(batches(train, recipe.schedule.batch_size, rank, world, WARMUP + steps))
    copied = torch_copies(step, taken)
    dist.barrier()
    return {"torch_bytes": copied}


def measure(recipe: str, steps: int) -> dict[str, Any]:
    """MB copied per step by each system: by torch, by Horovod, in all, and in all over the
    plain loop's (`exchange_mb`); and the gradients' MB."""
    figures: dict[str, Any] = {}
    env = {**os.environ, **ONE_THREAD, "PYTHONPATH": str(ROOT)}
    with tempfile.TemporaryDirectory() as work:
        for name, (launcher, system, overrides) in SYSTEMS.items():
            worker = ["-m", "benchmarks.copies", "--worker", system, "--recipe", recipe,
                      "--steps", str(steps), *overrides]  # fmt: skip
            timeline = Path(work) / f"{name}.json"
            run_env = env
            if launcher == "python":
                command = [PYTHON, *worker]
            elif launcher == "horovodrun":
                command = [str(BIN / "horovodrun"), "-np", "2", "--gloo", PYTHON, *worker]
                run_env = env | {"HOROVOD_TIMELINE": str(timeline)}
            else:
                command = [PYTHON, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                           "--master-port", "29533", *worker]  # fmt: skip
            job = subprocess.run(command, capture_output=True, text=True, env=run_env, cwd=ROOT)
            if job.returncode != 0:
                raise RuntimeError(f"{' '.join(command)} failed:\n{job.stdout[-3000:]}")
            [counted] = results([job.stdout])
            horovod = horovod_copies(timeline, WARMUP + steps) if timeline.exists() else 0.0
            torch_mb, horovod_mb = counted["torch_bytes"] / 1e6, horovod / 1e6
            total = torch_mb + horovod_mb
            plain = figures["plain"]["total_mb"] if figures else total
            figures[name] = {"torch_mb": torch_mb, "horovod_mb": horovod_mb, "total_mb": total,
                             "exchange_mb": total - plain}  # fmt: skip
            if "gradient_bytes" in counted:
                figures["gradient_mb"] = counted["gradient_bytes"] / 1e6
    return json.loads(json.dumps(figures), parse_float=lambda text: round(float(text), 1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--recipe", default="resnet18")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("overrides", nargs="*", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker is None:
        print(json.dumps(measure(args.recipe, args.steps), indent=2))
        return
    import torch

    torch.set_num_threads(1)
    if args.worker == "hvd_train":
        counted = hvd_train_worker(args.recipe, args.steps, args.overrides)
    elif args.worker == "plain":
        counted = plain_worker(args.recipe, args.steps)
    else:
        counted = ddp_worker(args.recipe, args.steps, bf16=args.worker == "ddp_bf16")
    if int(os.environ.get("RANK") or os.environ.get("HOROVOD_RANK") or 0) == 0:
        print("RESULT " + json.dumps(counted), flush=True)
    sys.stdout.flush()
    if args.worker.startswith("ddp"):
        os._exit(0)  # torch's Gloo threads may abort the exit (benchmarks.torch_baselines)


if __name__ == "__main__":
    main()
