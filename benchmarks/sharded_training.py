"""Each shard stage trains a recipe to the unsharded run's results: `horovodrun -np 2` trains
it under each framework with `horovod.shard` "none", "optimizer" and "gradients", the same seed
and steps, and sets each stage's checkpoint against the unsharded one, tensor for tensor (the
weights and the optimizer's state), beside the runs' own figures (loss, validation accuracy).
Prints one JSON object; the docs show it (`python -m benchmarks.render`).

    python -m benchmarks.sharded_training [--recipe resnet18] [--steps 150] \
        > docs/results/sharding-resnet18.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import load_file

from benchmarks.run import BIN, PYTHON, ROOT, environment, machine

FRAMEWORKS = ("torch", "tensorflow")
SHARDS = ("none", "optimizer", "gradients")
KEPT = ("model.safetensors", "optimizer.safetensors")


def train(recipe: str, framework: str, shard: str, steps: int, output: Path) -> dict[str, Any]:
    """One run at np=2 on Gloo: its summary and wall time."""
    command = [str(BIN / "horovodrun"), "-np", "2", "--gloo", PYTHON, "-m", "hvd_train",
               "--recipe", recipe, "--framework", framework, "--epochs", "1", "--limit-steps",
               str(steps), "--seed", "5", "--output-dir", str(output),
               "--set", f'horovod.shard="{shard}"']  # fmt: skip
    started = time.monotonic()
    result = subprocess.run(command, capture_output=True, text=True, env=environment(), cwd=ROOT)
    if result.returncode != 0:
        raise RuntimeError(
            f"{' '.join(command)} failed:\n{(result.stdout + result.stderr)[-3000:]}"
        )
    summary = json.loads((output / "summary.json").read_text())
    return {"wall_seconds": round(time.monotonic() - started, 1), "summary": summary}


def checkpoint(output: Path, kept: str) -> dict[str, np.ndarray]:
    """The tensors of the run's last checkpoint (one epoch: its only one)."""
    [folder] = sorted((output / "checkpoints").iterdir())
    return load_file(folder / kept)


def against(whole: Path, sharded: Path) -> dict[str, Any]:
    """How a sharded run's checkpoint differs from the unsharded one's, per file: the tensors
    not equal bit for bit, and the largest difference of any value."""
    compared: dict[str, Any] = {}
    for kept in KEPT:
        expected, actual = checkpoint(whole, kept), checkpoint(sharded, kept)
        if expected.keys() != actual.keys():
            raise RuntimeError(f"{kept}: the sharded run saved other tensors than the unsharded")
        different = [name for name in expected if not np.array_equal(expected[name], actual[name])]
        largest = max(float(np.max(np.abs(expected[n] - actual[n]), initial=0)) for n in expected)
        compared[kept] = {"tensors": len(expected), "different": different,
                          "largest_difference": largest}  # fmt: skip
    return compared


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--recipe", default="resnet18")
    parser.add_argument("--steps", type=int, default=150)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as work:
        for framework in FRAMEWORKS:
            outputs = {shard: Path(work) / framework / shard for shard in SHARDS}
            runs = {shard: train(args.recipe, framework, shard, args.steps, output)
                    for shard, output in outputs.items()}  # fmt: skip
            for shard, run in runs.items():
                compared = None if shard == "none" else against(outputs["none"], outputs[shard])
                rows.append({"framework": framework, "shard": shard, **run,
                             "against_unsharded": compared})  # fmt: skip
    print(json.dumps({"machine": machine(), "recipe": args.recipe, "steps": args.steps,
                      "ranks": 2, "rows": rows}, indent=2))  # fmt: skip


if __name__ == "__main__":
    main()
