"""Whether TensorFlow's exchange would gain from one flat buffer, as torch's did: two ways of
averaging gradients shaped like a recipe's, side by side, in compiled functions as the
backend's step is.

    python -m benchmarks.tf_flat [--recipe resnet18] [--repeats 30] [--json FILE]

  grouped   what the backend does: the gradients in one grouped_allreduce, which Horovod copies
            into its fusion buffer and out again
  flat      the gradients concatenated into one tensor (a copy), allreduced as one (Horovod
            copies it into the op's new output tensor: TensorFlow has no in-place op), and split
            back (a copy per gradient)

Two ranks on this host (horovodrun, Gloo), one thread each. Prints one JSON object (or writes
it to FILE): milliseconds per exchange, the best of --repeats of each way in each of two
interleaved rounds, and flat over grouped. docs/performance.md, "Gradients in place", shows it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.run import BIN, PYTHON, ROOT, machine, results


def best_milliseconds(function, tensors: list[Any], repeats: int) -> float:
    function(tensors)  # traced and warmed up
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        function(tensors)[0].numpy()  # back on the host: the exchange is done
        times.append(time.perf_counter() - started)
    return 1000 * min(times)


def worker(recipe_name: str, repeats: int) -> None:
    from hvd_train.recipe import load_recipe
    from hvd_train.training.run import open_run

    # The layer first: it sets TensorFlow's environment before TensorFlow loads.
    run = open_run("tensorflow", load_recipe(recipe_name), seed=0)
    import horovod.tensorflow as hvd
    import tensorflow as tf

    tensors = [tf.ones_like(weight) for weight in run.dist.exchange.model.trainable_weights]
    shapes = [t.shape for t in tensors]
    sizes = [int(np.prod(shape)) for shape in shapes]

    @tf.function(autograph=False)
    def grouped(tensors):
        return hvd.grouped_allreduce(tensors, op=hvd.Average, name="grouped")

    @tf.function(autograph=False)
    def flat(tensors):
        averaged = hvd.allreduce(tf.concat([tf.reshape(t, [-1]) for t in tensors], 0),
                                 op=hvd.Average, name="flat")  # fmt: skip
        return [tf.reshape(part, shape)
                for part, shape in zip(tf.split(averaged, sizes), shapes, strict=True)]  # fmt: skip

    times = {}
    for _ in range(2):  # interleaved, against the machine's slow spells
        for name, function in (("grouped", grouped), ("flat", flat)):
            milliseconds = best_milliseconds(function, tensors, repeats)
            times[name] = min(times.get(name, np.inf), milliseconds)
    if hvd.rank() == 0:
        grouped_ms, flat_ms = times["grouped"], times["flat"]
        figures = {"recipe": recipe_name, "ranks": hvd.size(),
                   "grouped_ms": round(grouped_ms, 2), "flat_ms": round(flat_ms, 2),
                   "flat_over_grouped": round(flat_ms / grouped_ms, 3)}  # fmt: skip
        print("RESULT " + json.dumps(figures), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--recipe", default="resnet18")
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--json", type=Path, help="write the JSON object here")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.recipe, args.repeats)
        return
    command = [str(BIN / "horovodrun"), "-np", "2", "--gloo", PYTHON, "-m", "benchmarks.tf_flat",
               "--worker", "--recipe", args.recipe, "--repeats", str(args.repeats)]  # fmt: skip
    env = {**os.environ, "HVD_TRAIN_THREADS": "1", "PYTHONPATH": str(ROOT)}
    job = subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT, check=True)
    [figures] = results([job.stdout])
    text = json.dumps(figures | {"machine": machine()}, indent=2)
    if args.json:
        args.json.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
