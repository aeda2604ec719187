"""The input pipelines hvd_train could be built on, side by side in one run: each reads the same
batches (64 examples, the indices a rank's shard gives) with two workers and two batches of
prefetch, while the main thread only takes them, so the figure is the loader's own:
  - hvd_train: Grain's MapDataset read by threads (hvd_train/data/pipeline.py);
  - Grain's worker processes (`mp_prefetch`, processes started with spawn);
  - torch's DataLoader, worker processes (fork), a batch per item;
  - tf.data, `map` of a NumPy function with two parallel calls, then `prefetch`.
Three sources: MNIST in memory (taking a batch is a copy), the same behind a source whose
every read waits 10 ms (network storage), and MNIST as PNG files (decoded by OpenCV). Each
loader gives the seconds to its first batch (its start: an epoch starts one, unless the workers
persist) and batches/s after it over --batches batches, the best of --repeats; each loader runs
in its own process, taking turns.

    python -m benchmarks.loaders [--batches 200] [--repeats 2] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.run import PYTHON, ROOT, machine

LOADERS = ("hvd_train", "grain processes", "torch DataLoader", "tf.data")
SOURCES = ("memory", "waiting 10 ms", "png files")
BATCH, WORKERS, PREFETCH = 64, 2, 2


class Waiting:
    """A dataset whose every read waits 10 ms first."""

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, indices: np.ndarray) -> Any:
        time.sleep(0.01)
        return self.dataset[indices]


class Batches:
    """Batch `i` of the run as an item, for the loaders that take items (DataLoader, Grain)."""

    def __init__(self, dataset: Any, steps: list[np.ndarray]) -> None:
        self.dataset, self.steps = dataset, steps

    def __len__(self) -> int:
        return len(self.steps)

    def __getitem__(self, index: int) -> Any:
        from hvd_train.data import take

        return take(self.dataset, self.steps[index])


def source(name: str, images: Path) -> Any:
    from hvd_train.recipe import Data, Recipe, load_data, load_recipe

    if name == "png files":
        data = Data("folder", path=str(images), input_shape=(28, 28, 1), num_classes=10)
        return load_data(Recipe(data=data, torch_model=lambda: None), None).train
    train = load_data(load_recipe("mnist_cnn"), None).train
    return Waiting(train) if name == "waiting 10 ms" else train


def read(loader: str, dataset: Any, steps: list[np.ndarray]) -> Iterator[int]:
    """Every batch read with `loader`: its number of examples."""
    if loader == "hvd_train":
        from hvd_train.data.pipeline import read_ahead

        for ((x, _),) in read_ahead(dataset, [[s] for s in steps], WORKERS, PREFETCH):
            yield len(x)
    elif loader == "grain processes":
        from hvd_train.data.pipeline import _grain

        grain = _grain()
        iterator = grain.MapDataset.source(Batches(dataset, steps)).to_iter_dataset()
        options = grain.multiprocessing.MultiprocessingOptions(num_workers=WORKERS)
        for x, _ in iterator.mp_prefetch(options):
            yield len(x)
    elif loader == "torch DataLoader":
        from torch.utils.data import DataLoader

        batches = DataLoader(Batches(dataset, steps), batch_size=None, num_workers=WORKERS,
                             prefetch_factor=PREFETCH, collate_fn=lambda batch: batch)  # fmt: skip
        for x, _ in batches:
            yield len(x)
    else:
        import tensorflow as tf

        items = Batches(dataset, steps)
        batches = tf.data.Dataset.range(len(steps)).map(
            lambda i: tf.numpy_function(lambda j: items[int(j)], [i], (tf.float32, tf.int64)),
            num_parallel_calls=WORKERS, deterministic=True,
        ).prefetch(PREFETCH)  # fmt: skip
        for x, _ in batches:
            yield len(x)


def one(loader: str, name: str, images: Path, batches: int) -> dict[str, float]:
    """One loader on one source, in this process: the seconds to its first batch (its start),
    and its batches/s after it."""
    dataset = source(name, images)
    order = np.random.default_rng(0).permutation(len(dataset))[: batches * BATCH]
    steps = list(order.reshape(batches, BATCH))
    started = time.perf_counter()
    counts = read(loader, dataset, steps)
    count = next(counts)
    first = time.perf_counter()
    count += sum(counts)
    seconds = time.perf_counter() - first
    assert count == batches * BATCH, count
    return {"start_s": round(first - started, 3),
            "batches_per_second": round((batches - 1) / seconds, 1)}  # fmt: skip


def measure(loader: str, name: str, images: Path, batches: int) -> dict[str, float]:
    command = [PYTHON, "-m", "benchmarks.loaders", "--one", loader, name, str(images),
               "--batches", str(batches)]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, check=False,
                            env=os.environ | {"TF_CPP_MIN_LOG_LEVEL": "3",
                                              "PYTHONPATH": str(ROOT)})  # fmt: skip
    if result.returncode:
        raise RuntimeError(f"{loader} on {name} failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--one", nargs=3, help=argparse.SUPPRESS)  # LOADER SOURCE IMAGES
    args = parser.parse_args()
    if args.one:
        loader, name, images = args.one
        print(json.dumps(one(loader, name, Path(images), args.batches)))
        return
    best: dict[str, dict[str, dict[str, float]]] = {name: {} for name in SOURCES}
    with tempfile.TemporaryDirectory() as directory:
        images = Path(directory) / "images"
        subprocess.run([PYTHON, str(ROOT / "scripts" / "make-image-folder"), str(images),
                        "--limit", str(args.batches * BATCH)],
                       check=True, capture_output=True)  # fmt: skip
        for _ in range(args.repeats):
            for name in SOURCES:
                for loader in LOADERS:
                    figures = measure(loader, name, images, args.batches)
                    kept = best[name].get(loader)
                    best[name][loader] = figures if kept is None else {
                        "start_s": min(kept["start_s"], figures["start_s"]),
                        "batches_per_second": max(kept["batches_per_second"],
                                                  figures["batches_per_second"]),
                    }  # fmt: skip
    rows = [{"source": name, **figures,
             "over_hvd_train": {loader: round(figures[loader]["batches_per_second"]
                                              / figures["hvd_train"]["batches_per_second"], 2)
                                for loader in LOADERS[1:]}}
            for name, figures in best.items()]  # fmt: skip
    result = {"machine": machine(), "batches": args.batches, "batch": BATCH, "workers": WORKERS,
              "repeats": args.repeats, "rows": rows}  # fmt: skip
    if args.json:
        print(json.dumps(result, indent=2))
        return
    for row in rows:
        parts = [f"{loader} {row[loader]['batches_per_second']:.0f} (start "
                 f"{row[loader]['start_s']:.2f} s)" for loader in LOADERS]  # fmt: skip
        ratios = [f"{loader} {ratio:.2f}" for loader, ratio in row["over_hvd_train"].items()]
        print(f"{row['source']}: batches/s {', '.join(parts)}; over hvd_train: "
              f"{', '.join(ratios)}")  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
