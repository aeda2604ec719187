"""Mixed precision against fp32, side by side: `hvd-train bench` of each recipe under each
framework, alone and at np=2, with `precision` fp32 and bf16-mixed taking turns.

    python -m benchmarks.precision [--recipes mnist_cnn,resnet18] [--steps 20] [--repeats 2]
                                   [--precisions fp32,bf16-mixed] [--json]

Synthetic data of each recipe's shape; one thread per rank at np=2, the machine's cores alone.
Each ratio (over fp32) is taken within one round, and the best of the rounds is shown.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from benchmarks.run import BIN, PYTHON, machine, run_all

FRAMEWORKS = ("torch", "tensorflow")


def bench(recipe: str, framework: str, np: int, precision: str, steps: int) -> dict[str, Any]:
    command = [PYTHON, "-m", "hvd_train", "bench", "--synthetic", "--json", "--recipe", recipe,
               "--framework", framework, "--steps", str(steps), "--warmup", "5",
               "--set", f"precision={precision}"]  # fmt: skip
    if np > 1:
        command = [str(BIN / "horovodrun"), "-np", str(np), "--gloo", *command]
    [figures] = run_all([(command, {})])
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--recipes", default="mnist_cnn,resnet18")
    parser.add_argument("--precisions", default="fp32,bf16-mixed")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    precisions = args.precisions.split(",")
    rows = []
    for recipe in args.recipes.split(","):
        for framework in FRAMEWORKS:
            for np in (1, 2):
                rounds = [{p: bench(recipe, framework, np, p, args.steps)["images_per_second"]
                           for p in precisions} for _ in range(args.repeats)]  # fmt: skip
                best = {p: max(r[p] for r in rounds) for p in precisions}
                ratios = {p: round(max(r[p] / r[precisions[0]] for r in rounds), 2)
                          for p in precisions[1:]}  # fmt: skip
                over = f"over_{precisions[0]}"
                rows.append({"recipe": recipe, "framework": framework, "np": np,
                             "images_per_second": best, over: ratios})  # fmt: skip
    if args.json:
        print(json.dumps({"machine": machine(), "steps": args.steps, "rows": rows}, indent=2))
        return
    print(f"images/s, best of {args.repeats}; {machine()}")
    print(f"  {'recipe':12} {'framework':11} np " + "".join(f"{p:>13}" for p in precisions)
          + "   ratio")  # fmt: skip
    for row in rows:
        cells = "".join(f"{row['images_per_second'][p]:13.1f}" for p in precisions)
        ratios = " ".join(f"{v:.2f}x" for v in row["over_" + precisions[0]].values())
        print(f"  {row['recipe']:12} {row['framework']:11} {row['np']:2} {cells}   {ratios}")


if __name__ == "__main__":
    main()
