"""The README's first run, measured: `horovodrun -np 2 python -m hvd_train --recipe mnist_cnn
--framework F` with the recipe's defaults, on Gloo, for each framework. Prints one JSON object
(each run's summary.json, rank 0's lines and the command's wall time) and draws both runs'
curves; the docs show both (`python -m benchmarks.render`).

    python -m benchmarks.default_run --chart docs/results/curves.png > docs/results/default-run.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
import time
from pathlib import Path

from benchmarks.run import BIN, PYTHON, machine
from hvd_train.training.plot import plot_runs

FRAMEWORKS = ("torch", "tensorflow")


def train(framework: str, output: Path) -> dict:
    arguments = ["-np", "2", "--gloo", "python", "-m", "hvd_train", "--recipe", "mnist_cnn",
                 "--framework", framework]  # fmt: skip
    command = [str(BIN / "horovodrun"), *arguments, "--output-dir", str(output)]
    command[command.index("python")] = PYTHON
    started = time.monotonic()
    result = subprocess.run(command, capture_output=True, text=True, check=True)
    wall_seconds = round(time.monotonic() - started, 1)
    output_lines = (result.stdout + result.stderr).splitlines()
    return {
        "command": " ".join(["horovodrun", *arguments]),
        "wall_seconds": wall_seconds,
        "summary": json.loads((output / "summary.json").read_text()),
        "lines": [line for line in output_lines if line.startswith("[0]")],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chart", type=Path, help="draw both runs' curves into this PNG")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        folders = {framework: Path(work) / framework for framework in FRAMEWORKS}
        runs = {framework: train(framework, folder) for framework, folder in folders.items()}
        if args.chart:
            plot_runs(list(folders.values()), args.chart)
    print(json.dumps({"machine": machine(), "runs": runs}, indent=2))


if __name__ == "__main__":
    main()
