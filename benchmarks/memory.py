"""Memory per rank, two ways.

`data`: a training set larger than memory should not be: each rank's peak resident memory at
np=2 (torch, mnist_cnn, --steps steps) with a 4 GB training set on disk (--large-gb) against the
same recipe with an 80 MB one, for the two ways a set stays on disk:
  - a memory-mapped array handed over by a Python recipe (benchmarks/memmap_mnist.py; MNIST's
    training images, normalised, repeated to the size);
  - the same examples as ArrayRecord shards (`hvd-train write-records`, `dataset = "records"`).
Each figure is the peak over either rank, polled every 0.1 s, of its resident memory and of the
part of it that is the process's own (anonymous: resident less the file pages mapped, which
are the page cache, shared and given back under pressure; a memory-mapped array's pages that a
batch touched, and the kernel's read-around with them, count as resident).

`state`: the training state sharded (`[horovod] shard`): a model of about 100 M parameters
under AdamW (benchmarks/sharded_model.py), a few steps then a checkpoint, under each framework
at np=2 and np=3 under each shard setting: each rank's peak resident memory after the steps and
after saving, and the bytes of training state it holds. glibc's allocator keeps buffers the
process freed unless they were mapped alone, so every run maps buffers of 1 MB and more alone
(MALLOC_MMAP_THRESHOLD_), and TensorFlow's oneDNN kernels, which keep their own pool of freed
buffers, growing in ever larger regions, are off (TF_ENABLE_ONEDNN_OPTS=0): the figures are
what the process holds, not what it once held.
Targets: "optimizer" lowers each rank's peak by at least 0.8 x (1 - 1/N) x the optimizer
state's bytes against "none", "gradients" by at least 0.8 x (1 - 1/N) x the gradients' bytes
more, and saving raises no rank's peak above the unsharded run's.

    python -m benchmarks.memory [data] [--steps 100] [--large-gb 4] [--json]
    python -m benchmarks.memory state [--frameworks torch,tensorflow] [--ranks 2,3] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
import threading
from pathlib import Path
from typing import Any

import numpy as np
import psutil

from benchmarks.run import BIN, PYTHON, ROOT, machine

SMALL_BYTES = 80e6
EXAMPLE_BYTES = 28 * 28 * 4
MEMMAP_RECIPE = str(ROOT / "benchmarks" / "memmap_mnist.py")
RECORDS = """{mnist_cnn}
[data]
dataset = "records"
path = "{path}"
input_shape = [28, 28, 1]
num_classes = 10
"""


def write_arrays(folder: Path, size: float) -> None:
    """MNIST's training images (normalised as the mnist source gives them) and labels, repeated
    to `size` bytes of images, as x.npy and y.npy."""
    from hvd_train.recipe import load_data, load_recipe

    train = load_data(load_recipe("mnist_cnn"), None).train
    images, labels = train[np.arange(len(train))]
    count = int(size // EXAMPLE_BYTES)
    folder.mkdir(parents=True)
    x = np.lib.format.open_memmap(folder / "x.npy", "w+", np.float32, (count, 28, 28, 1))
    y = np.lib.format.open_memmap(folder / "y.npy", "w+", np.int64, (count,))
    for first in range(0, count, len(images)):
        part = min(len(images), count - first)
        x[first : first + part], y[first : first + part] = images[:part], labels[:part]
    x.flush()
    y.flush()


def peak_rss(command: list[str], environment: dict[str, str]) -> tuple[int, int]:
    """Runs `command` (horovodrun); the largest resident set of its training processes, and
    the largest anonymous part of one."""
    job = subprocess.Popen(command, env=os.environ | environment, cwd=ROOT,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
    peak, own, done = 0, 0, threading.Event()

    def poll() -> None:
        nonlocal peak, own
        while not done.wait(0.1):
            try:
                children = psutil.Process(job.pid).children(recursive=True)
            except psutil.NoSuchProcess:
                return
            for child in children:
                try:
                    if "hvd_train" in " ".join(child.cmdline()):
                        memory = child.memory_info()  # shared: the file pages mapped
                        peak, own = max(peak, memory.rss), max(own, memory.rss - memory.shared)
                except psutil.Error:
                    pass

    poller = threading.Thread(target=poll)
    poller.start()
    output = job.communicate(timeout=1800)[0]
    done.set()
    poller.join()
    if job.returncode:
        raise RuntimeError(f"{command} failed:\n{output[-3000:]}")
    return peak, own


def train(recipe: str, steps: int, environment: dict[str, str]) -> tuple[int, int]:
    with tempfile.TemporaryDirectory() as output:
        command = [str(BIN / "horovodrun"), "-np", "2", "--gloo", PYTHON, "-m", "hvd_train",
                   "--recipe", recipe, "--framework", "torch", "--epochs", "1",
                   "--limit-steps", str(steps), "--output-dir", output]  # fmt: skip
        return peak_rss(command, environment)


SHARDS = ("none", "optimizer", "gradients")
TARGET_SHARE = 0.8  # of the bytes a stage stops holding, by which its peak must fall


def state_memory(framework: str, ranks: int, shard: str) -> list[dict[str, int]]:
    """Per rank: its peaks and the training state it holds (benchmarks/sharded_model.py)."""
    with tempfile.TemporaryDirectory() as output:
        command = [str(BIN / "horovodrun"), "-np", str(ranks), "--gloo", PYTHON,
                   str(ROOT / "benchmarks" / "sharded_model.py"), framework, shard,
                   output]  # fmt: skip
        environment = os.environ | {"MALLOC_MMAP_THRESHOLD_": str(2**20),
                                    "TF_ENABLE_ONEDNN_OPTS": "0"}  # fmt: skip
        result = subprocess.run(command, capture_output=True, text=True, env=environment,
                                cwd=ROOT, timeout=1800)  # fmt: skip
    line = next((line for line in result.stdout.splitlines() if "STATE " in line), None)
    if result.returncode or line is None:
        raise RuntimeError(f"{command} failed:\n{(result.stdout + result.stderr)[-3000:]}")
    return list(json.loads(line.split("STATE ", 1)[1]))


def state(frameworks: list[str], ranks: list[int]) -> dict[str, Any]:
    """Each stage's figures per framework at each world size, and whether the targets hold."""
    rows = []
    for framework, world in ((f, n) for f in frameworks for n in ranks):
        held = {shard: state_memory(framework, world, shard) for shard in SHARDS}
        whole = held["none"][0]
        share = TARGET_SHARE * (1 - 1 / world)
        wanted = {"none": 0.0, "optimizer": share * whole["optimizer"]}
        wanted["gradients"] = wanted["optimizer"] + share * whole["gradients"]
        for shard, figures in held.items():
            lowered = [a["peak_training"] - b["peak_training"]
                       for a, b in zip(held["none"], figures, strict=True)]  # fmt: skip
            saving = [b["peak_saving"] <= a["peak_saving"]
                      for a, b in zip(held["none"], figures, strict=True)]  # fmt: skip
            rows.append({
                "framework": framework, "ranks": world, "shard": shard,
                "parameters": whole["parameters"],
                "held_bytes": [{key: rank[key] for key in ("weights", "gradients", "optimizer")}
                               for rank in figures],
                "peak_training_mb": [round(rank["peak_training"] / 2**20) for rank in figures],
                "peak_saving_mb": [round(rank["peak_saving"] / 2**20) for rank in figures],
                "lowered_mb": [round(value / 2**20) for value in lowered],
                "target_mb": round(wanted[shard] / 2**20),
                "met": all(value >= wanted[shard] for value in lowered) and all(saving),
            })  # fmt: skip
    return {"machine": machine(), "rows": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", nargs="?", choices=("data", "state"), default="data")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--large-gb", type=float, default=4.0, help="the large set's size")
    parser.add_argument("--ranks", default="2,3", help="the world sizes the state runs at")
    parser.add_argument("--frameworks", default="torch,tensorflow",
                        help="the frameworks the state runs under")  # fmt: skip
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    if args.what == "state":
        result = state(args.frameworks.split(","), [int(n) for n in args.ranks.split(",")])
        if args.json:
            print(json.dumps(result, indent=2))
            return
        for row in result["rows"]:
            held = ", ".join("/".join(str(round(rank[k] / 2**20)) for rank in row["held_bytes"])
                             for k in ("weights", "gradients", "optimizer"))  # fmt: skip
            print(f"{row['framework']} np={row['ranks']} shard={row['shard']:9s} peak MB per rank "
                  f"{row['peak_training_mb']} (saving {row['peak_saving_mb']}), lowered "
                  f"{row['lowered_mb']} (target {row['target_mb']}): "
                  f"{'met' if row['met'] else 'NOT met'}; held MB (weights, gradients, "
                  f"optimizer) {held}")  # fmt: skip
        return
    peaks: dict[str, dict[str, tuple[int, int]]] = {"memory-mapped array": {}, "record files": {}}
    mnist_cnn = (ROOT / "recipes" / "mnist_cnn.toml").read_text().split("[model]", 1)[1]
    sizes = {"small": SMALL_BYTES, "large": args.large_gb * 1e9}
    with tempfile.TemporaryDirectory() as directory:
        for name, size in sizes.items():
            arrays = Path(directory) / name / "arrays"
            write_arrays(arrays, size)
            environment = {"HVD_TRAIN_BENCH_ARRAYS": str(arrays)}
            peaks["memory-mapped array"][name] = train(MEMMAP_RECIPE, args.steps, environment)
            shards = arrays.parent / "shards"
            subprocess.run([PYTHON, "-m", "hvd_train", "write-records", "--recipe",
                            MEMMAP_RECIPE, str(shards)], env=os.environ | environment,
                           cwd=ROOT, check=True, capture_output=True)  # fmt: skip
            recipe = arrays.parent / "records.toml"
            recipe.write_text(RECORDS.format(mnist_cnn="[model]" + mnist_cnn, path=shards))
            peaks["record files"][name] = train(str(recipe), args.steps, {})
            for path in (arrays / "x.npy", *shards.iterdir()):
                path.unlink()  # room for the next size
    rows: list[dict[str, Any]] = [
        {"source": source,
         **{f"{n}_mb": [round(v / 2**20) for v in pair] for n, pair in figures.items()},
         "own_growth_mb": round((figures["large"][1] - figures["small"][1]) / 2**20)}
        for source, figures in peaks.items()
    ]  # fmt: skip
    result = {"machine": machine(), "steps": args.steps, "small_gb": SMALL_BYTES / 1e9,
              "large_gb": args.large_gb, "rows": rows}  # fmt: skip
    if args.json:
        print(json.dumps(result, indent=2))
        return
    for row in rows:
        (small, small_own), (large, large_own) = row["small_mb"], row["large_mb"]
        print(f"{row['source']}: peak resident memory per rank (its own), "
              f"{SMALL_BYTES / 1e9:g} GB set {small} MB ({small_own} MB), {args.large_gb:g} GB "
              f"set {large} MB ({large_own} MB): own {row['own_growth_mb']:+} MB")  # fmt: skip


if __name__ == "__main__":
    main()
