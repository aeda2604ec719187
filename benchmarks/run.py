"""hvd_train against what a user could pick instead, side by side in one run, on this machine.

    python -m benchmarks.run [--recipe mnist_cnn] [--steps 150] [--repeats 2] [--json FILE]
                             [--chart FILE.png]

Each system trains the same model on the same data (MNIST in memory) with 64 images per process
and step; each figure is the best of --repeats runs (the machine is noisy). It prints every
system's images/s, the ratios hvd_train aims at, and draws images/s against processes. One
process's overhead is measured with hvd_train's step and a plain loop's taking turns in one
process (the median of the repeats' ratios), since separate runs of the two moved by 10-20%.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import socket
import statistics
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any

from hvd_train.frameworks import FRAMEWORKS

PYTHON = sys.executable
BIN = Path(PYTHON).parent
ROOT = Path(__file__).resolve().parent.parent
CORES = len(os.sched_getaffinity(0))


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def results(outputs: list[str]) -> list[dict[str, Any]]:
    """The RESULT lines and `hvd-train bench --json` objects in the processes' output."""
    found = []
    for output in outputs:
        for line in output.splitlines():
            line = re.sub(r"^\[\d+\]<stdout>:", "", line)
            if line.startswith("RESULT "):
                found.append(json.loads(line[len("RESULT ") :]))
            elif line.startswith('{"world_size"'):
                found.append(json.loads(line))
    return found


def environment(tree: Path = ROOT) -> dict[str, str]:
    """What a benchmark's processes run with, importing hvd_train from `tree`. Every system gets
    hvd_train's TensorFlow settings (where the environment gives none): the same kernels, so
    the ratios compare how each trains."""
    return {**FRAMEWORKS["tensorflow"].environment, **os.environ, "PYTHONPATH": str(tree),
            "TF_CPP_MIN_LOG_LEVEL": "3"}  # fmt: skip


def run_all(commands: list[tuple[list[str], dict[str, str]]]) -> list[dict[str, Any]]:
    """Starts the commands at once (one system's processes), waits, and returns their results."""
    shared = environment()
    jobs = [subprocess.Popen(command, env=shared | extra, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, cwd=ROOT)
            for command, extra in commands]  # fmt: skip
    outputs = [job.communicate(timeout=900)[0] for job in jobs]
    for job, output in zip(jobs, outputs, strict=True):
        if job.returncode != 0:
            raise RuntimeError(f"{job.args} failed:\n{output[-3000:]}")
    return results(outputs)


# hvd_train's step and a plain loop's, taking turns in one process of 2 threads: their ratio is
# hvd_train's own overhead, whatever the machine's speed at the time.
TAKING_TURNS = {
    framework: f"hvd_train {framework} and a plain loop taking turns, 1 process x 2 threads"
    for framework in ("torch", "tensorflow")
}
ONE_PROCESS = {"THREADS": "2", "HVD_TRAIN_THREADS": "2"}


def hvd_train(framework: str, recipe: str, steps: int, np: int, threads: int | None = None):
    bench = [PYTHON, "-m", "hvd_train", "bench", "--json", "--recipe", recipe,
             "--framework", framework, "--steps", str(steps)]  # fmt: skip
    extra = {"HVD_TRAIN_THREADS": str(threads)} if threads else {}
    if np == 1:
        return [(bench, extra)]
    return [([str(BIN / "horovodrun"), "-np", str(np), "--gloo", *bench], extra)]


def systems(recipe: str, steps: int) -> dict[str, tuple[str, list]]:
    """name -> (framework, the commands to start at once)."""
    torch_script = ["-m", "benchmarks.torch_baselines"]
    tf_script = ["-m", "benchmarks.tf_baselines"]
    mwms_ports = [free_port(), free_port()]
    cluster = {"worker": [f"127.0.0.1:{port}" for port in mwms_ports]}
    mwms = [
        ([PYTHON, *tf_script, "mwms", recipe, str(steps)],
         {"TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": "worker", "index": i}})})
        for i in range(2)
    ]  # fmt: skip
    torchrun = [PYTHON, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                "--master-port", str(free_port())]  # fmt: skip
    return {
        "hvd_train torch, 1 process x 1 thread": ("torch", hvd_train("torch", recipe, steps, 1, 1)),
        "hvd_train torch, 2 x 1-thread processes alone, at once (the limit)": (
            "torch", hvd_train("torch", recipe, steps, 1, 1) * 2),
        "hvd_train torch, 1 process x 2 threads": ("torch", hvd_train("torch", recipe, steps, 1)),
        "torch, plain loop, 1 process x 2 threads": (
            "torch", [([PYTHON, *torch_script, "plain", recipe, str(steps)], {"THREADS": "2"})]),
        TAKING_TURNS["torch"]: (
            "torch", [([PYTHON, *torch_script, "alternate", recipe, str(steps)], ONE_PROCESS)]),
        "hvd_train torch, np=2": ("torch", hvd_train("torch", recipe, steps, 2)),
        "torch, hand-written Horovod loop, np=2": (
            "torch", [([str(BIN / "horovodrun"), "-np", "2", "--gloo", PYTHON, *torch_script,
                        "horovod", recipe, str(steps)], {})]),
        "torch DDP (Gloo, torchrun), np=2": (
            "torch", [([*torchrun, *torch_script, "ddp", recipe, str(steps)], {})]),
        "hvd_train tensorflow, 1 process x 2 threads": (
            "tensorflow", hvd_train("tensorflow", recipe, steps, 1)),
        "TensorFlow, plain tf.function loop, 1 process x 2 threads": (
            "tensorflow", [([PYTHON, *tf_script, "plain", recipe, str(steps)], {"THREADS": "2"})]),
        TAKING_TURNS["tensorflow"]: (
            "tensorflow", [([PYTHON, *tf_script, "alternate", recipe, str(steps)], ONE_PROCESS)]),
        "hvd_train tensorflow, np=2": ("tensorflow", hvd_train("tensorflow", recipe, steps, 2)),
        "TensorFlow MultiWorkerMirroredStrategy (custom loop), 2 workers": ("tensorflow", mwms),
    }  # fmt: skip


TARGETS = [  # (what, numerator, denominator (None: its taking-turns ratio), factor, target)
    ("torch np=2 / 2 x one rank on one core", "hvd_train torch, np=2",
     "hvd_train torch, 1 process x 1 thread", 2, 0.90),
    ("torch np=2 / torch DDP np=2", "hvd_train torch, np=2", "torch DDP (Gloo, torchrun), np=2",
     1, 1.00),
    ("tensorflow np=2 / MultiWorkerMirroredStrategy", "hvd_train tensorflow, np=2",
     "TensorFlow MultiWorkerMirroredStrategy (custom loop), 2 workers", 1, 1.00),
    ("torch np=1 / plain loop, same threads, taking turns", TAKING_TURNS["torch"], None, 1, 0.95),
    ("tensorflow np=1 / plain loop, same threads, taking turns", TAKING_TURNS["tensorflow"], None,
     1, 0.95),
]  # fmt: skip


def machine() -> str:
    import hvd_train

    packages = ("torch", "tensorflow-cpu", "keras", "horovod")
    versions = ", ".join(f"{p} {metadata.version(p)}" for p in packages)
    versions += f", hvd_train {hvd_train.__version__}"
    return (f"{time.strftime('%Y-%m-%d')}, {platform.machine()}, {CORES} cores, "
            f"Python {platform.python_version()}, {versions}, CPU {cpu()}")  # fmt: skip


def cpu() -> str:
    """The CPU's model and its widest vector instructions that bear on the kernels (AVX512-BF16
    makes bf16 fast; the project's machines have had it on some days and not on others)."""
    info = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    model = next((line.split(":", 1)[1].strip() for line in info.splitlines()
                  if line.startswith("model name")), platform.processor() or "unknown")  # fmt: skip
    flags = set(next((line.split(":", 1)[1].split() for line in info.splitlines()
                      if line.startswith("flags")), []))  # fmt: skip
    widest = next((f for f in ("avx512_bf16", "avx512f", "avx2") if f in flags), "no AVX2")
    return f"{model} ({widest})"


def chart(best: dict[str, float], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    torch_one, tf_one = (
        "torch, plain loop, 1 process x 2 threads",
        ("TensorFlow, plain tf.function loop, 1 process x 2 threads"),
    )
    lines = {  # a system's 1-process point is its framework's plain loop where it has none
        "hvd_train torch": ["hvd_train torch, 1 process x 2 threads", "hvd_train torch, np=2"],
        "torch DDP": [torch_one, "torch DDP (Gloo, torchrun), np=2"],
        "Horovod, hand-written": [torch_one, "torch, hand-written Horovod loop, np=2"],
        "hvd_train tensorflow": ["hvd_train tensorflow, 1 process x 2 threads",
                                 "hvd_train tensorflow, np=2"],
        "TF MultiWorkerMirrored": [
            tf_one, "TensorFlow MultiWorkerMirroredStrategy (custom loop), 2 workers"],
        "limit (2 independent 1-core runs)": [
            "hvd_train torch, 1 process x 1 thread",
            "hvd_train torch, 2 x 1-thread processes alone, at once (the limit)"],
    }  # fmt: skip
    figure, axis = plt.subplots(figsize=(7, 4.5), layout="constrained")
    for label, (one, two) in lines.items():
        style = "k:" if label.startswith("limit") else "o-"
        axis.plot([1, 2], [best[one], best[two]], style, label=label)
    axis.set_xticks([1, 2], ["1 process\n(2 cores' threads)", "2 processes"])
    axis.set_ylabel("images/s (best of the repeats)")
    axis.set_title(f"Training throughput on {CORES} cores (1 process: all threads)")
    axis.grid(alpha=0.3)
    axis.legend(fontsize="small")
    figure.savefig(path, dpi=100)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--recipe", default="mnist_cnn")
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--only", help="run only the systems whose name contains this")
    parser.add_argument("--json", type=Path, help="also write the figures as JSON here")
    parser.add_argument("--chart", type=Path, help="draw images/s against processes here")
    args = parser.parse_args()
    best: dict[str, float] = {}
    turns: dict[str, list[float]] = {}  # hvd_train over the plain loop, per repeat
    for repeat in range(args.repeats):  # interleaved, so that slow spells hit every system
        for name, (_, commands) in systems(args.recipe, args.steps).items():
            if args.only and args.only not in name:
                continue
            found = run_all(commands)
            total = sum(r["images_per_second"] for r in found)
            best[name] = max(best.get(name, 0.0), total)
            line = f"  [{repeat + 1}/{args.repeats}] {name}: {total:.0f} images/s"
            if "plain_images_per_second" in found[0]:
                plain = found[0]["plain_images_per_second"]
                turns.setdefault(name, []).append(total / plain)
                line += f", the plain loop {plain:.0f}: {total / plain:.3f}"
            print(line, flush=True)
    print(f"\n{args.recipe}, 64 images per process and step, best of {args.repeats}; {machine()}")
    for name, value in best.items():
        print(f"  {value:8.0f}  {name}")
    print()
    for what, top, bottom, factor, target in TARGETS:
        if bottom is None and top in turns:
            ratio = statistics.median(turns[top])
        elif top in best and bottom in best:
            ratio = best[top] / (factor * best[bottom])
        else:
            continue
        verdict = "met" if ratio >= target else "NOT met"
        print(f"  {ratio:5.2f}  {what} (target >= {target:.2f}: {verdict})")
    if args.json:
        figures = {"machine": machine(), "best": best, "taking_turns": turns}
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    if args.chart and len(best) == len(systems(args.recipe, args.steps)):
        chart(best, args.chart)


if __name__ == "__main__":
    main()
