"""Reading data while the step runs, side by side in one run, mnist_cnn at np=2 under each
framework:
  - latency: MNIST in memory, and behind a source whose every read waits 10 ms (a stand-in for
    network storage) with the data workers off and on ("auto"); one epoch of --examples
    (benchmarks/slow_mnist.py: mnist_cnn's model and schedule, as a Python recipe's own data);
  - decoding: mnist_cnn's whole recipe (2 epochs) from MNIST's 70,000 PNG files
    (scripts/make-image-folder, `dataset = "folder"`, normalised as the mnist source is) and
    from MNIST in memory: test accuracy and images/s; and one epoch of each at np=1 (one rank,
    its passes on both cores).

    python -m benchmarks.data [--examples 30000] [--repeats 2] [--wait-ms 10] [--json]

Every run goes through `hvd_train` under `horovodrun -np 2 --gloo`; the rounds take turns, and
each figure is the best of --repeats.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.run import BIN, PYTHON, ROOT, machine, run_all

FRAMEWORKS = ("torch", "tensorflow")
RECIPE = str(ROOT / "benchmarks" / "slow_mnist.py")
# name: (the source's wait in ms, or None for the benchmark's --wait-ms; data.workers)
CONFIGURATIONS = {
    "in memory": (0.0, "auto"),
    "waiting, read in the step": (None, "0"),
    "waiting, workers auto": (None, "auto"),
}


def train(framework: str, examples: int, wait_ms: float, workers: str) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as output:
        command = [str(BIN / "horovodrun"), "-np", "2", "--gloo", PYTHON, "-m", "hvd_train",
                   "--recipe", RECIPE, "--framework", framework, "--epochs", "1",
                   "--set", f"data.workers={workers}", "--output-dir", output]  # fmt: skip
        environment = {"HVD_TRAIN_BENCH_EXAMPLES": str(examples),
                       "HVD_TRAIN_BENCH_WAIT_MS": str(wait_ms)}  # fmt: skip
        run_all([(command, environment)])
        summary = json.loads((Path(output) / "summary.json").read_text())
    return {key: summary[key] for key in ("images_per_second", "t_data_ms", "step_ms")}


MNIST_CNN = (ROOT / "recipes" / "mnist_cnn.toml").read_text()
FOLDER = """[data]
dataset = "folder"
path = "{path}"
input_shape = [28, 28, 1]
num_classes = 10
transforms = [{{ type = "normalize", mean = [{mean}], std = [{std}] }}]
"""


def decoding(framework: str, recipe: str, processes: int) -> dict[str, Any]:
    """mnist_cnn's whole recipe (`recipe`: its name or a file) at np=`processes` (at np=1, one
    epoch)."""
    epochs = [] if processes == 2 else ["--epochs", "1"]
    with tempfile.TemporaryDirectory() as output:
        command = [str(BIN / "horovodrun"), "-np", str(processes), "--gloo", PYTHON, "-m",
                   "hvd_train", "--recipe", recipe, "--framework", framework, *epochs,
                   "--output-dir", output]  # fmt: skip
        run_all([(command, {})])
        summary = json.loads((Path(output) / "summary.json").read_text())
    return {key: summary[key] for key in ("images_per_second", "t_data_ms", "test_accuracy")}


def folder_recipe(directory: Path) -> str:
    """mnist_cnn's recipe on MNIST written as PNG files into `directory`."""
    from hvd_train.data.mnist import MEAN, STD

    images = directory / "images"
    subprocess.run([PYTHON, str(ROOT / "scripts" / "make-image-folder"), str(images)],
                   check=True, capture_output=True)  # fmt: skip
    data = FOLDER.format(path=images, mean=MEAN, std=STD)
    text = re.sub(r"\[data\].*?\n\n", data + "\n", MNIST_CNN, count=1, flags=re.S)
    recipe = directory / "mnist_cnn_png.toml"
    recipe.write_text(text)
    return str(recipe)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--examples", type=int, default=30000)
    parser.add_argument("--wait-ms", type=float, default=10.0)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    best: dict[str, dict[str, dict[str, Any]]] = {f: {} for f in FRAMEWORKS}
    for _ in range(args.repeats):
        for framework in FRAMEWORKS:
            for name, (wait, workers) in CONFIGURATIONS.items():
                figures = train(framework, args.examples,
                                args.wait_ms if wait is None else wait, workers)  # fmt: skip
                kept = best[framework].get(name)
                if kept is None or figures["images_per_second"] > kept["images_per_second"]:
                    best[framework][name] = figures
    with tempfile.TemporaryDirectory() as directory:
        from_png = folder_recipe(Path(directory))
        decoded: dict[tuple[str, int], dict[str, dict[str, Any]]] = {
            (f, n): {} for f in FRAMEWORKS for n in (2, 1)
        }
        for _ in range(args.repeats):
            for framework, processes in decoded:
                for name, recipe in (("in memory", "mnist_cnn"), ("png files", from_png)):
                    figures = decoding(framework, recipe, processes)
                    kept = decoded[framework, processes].get(name)
                    if kept is None or figures["images_per_second"] > kept["images_per_second"]:
                        decoded[framework, processes][name] = figures
    rows = [
        {"framework": framework, **{name: figures[name] for name in CONFIGURATIONS},
         "hidden": round(figures["waiting, workers auto"]["images_per_second"]
                         / figures["in memory"]["images_per_second"], 3)}
        for framework, figures in best.items()
    ]  # fmt: skip
    decoding_rows = [
        {"framework": framework, "processes": processes, **figures,
         "over_memory": round(figures["png files"]["images_per_second"]
                              / figures["in memory"]["images_per_second"], 3)}
        for (framework, processes), figures in decoded.items()
    ]  # fmt: skip
    result = {"machine": machine(), "examples": args.examples, "wait_ms": args.wait_ms,
              "repeats": args.repeats, "rows": rows, "decoding": decoding_rows}  # fmt: skip
    if args.json:
        print(json.dumps(result, indent=2))
        return
    for row in rows:
        parts = [f"{name} {row[name]['images_per_second']:.0f} images/s "
                 f"(T_data {row[name]['t_data_ms']} ms)" for name in CONFIGURATIONS]  # fmt: skip
        print(f"{row['framework']}: {'; '.join(parts)}; waiting with workers over in memory: "
              f"{row['hidden']:.2f}")  # fmt: skip
    for row in decoding_rows:
        parts = [
            f"{name} {row[name]['images_per_second']:.0f} images/s, "
            f"{100 * row[name]['test_accuracy']:.2f}%"
            for name in ("in memory", "png files")
        ]
        print(f"{row['framework']} at np={row['processes']}: {'; '.join(parts)}; png over "
              f"memory {row['over_memory']:.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
