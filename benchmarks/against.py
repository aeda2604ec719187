"""The default recipe's speed in this tree against another commit's: did a change slow it?
One epoch of mnist_cnn at np=2 under each framework, the two trees taking turns (pairs), each
from a git worktree of its commit with this environment's packages; images/s of each run and,
for each framework, the best of this tree over the best of the other.

    python -m benchmarks.against REV [--pairs 2] [--json]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
from pathlib import Path

from benchmarks.run import BIN, PYTHON, ROOT, environment, machine
from hvd_train.api import DEFAULT_RECIPE

FRAMEWORKS = ("torch", "tensorflow")


def images_per_second(tree: Path, framework: str) -> float:
    """One epoch of the default recipe at np=2, run from `tree`, with `tree`'s own recipe file:
    the editable install maps the packaged recipes to this checkout's, whichever tree runs."""
    recipe = tree / "recipes" / f"{DEFAULT_RECIPE}.toml"
    with tempfile.TemporaryDirectory() as output:
        command = [str(BIN / "horovodrun"), "-np", "2", "--gloo", PYTHON, "-m", "hvd_train",
                   "--framework", framework, "--recipe", str(recipe), "--epochs", "1",
                   "--output-dir", output]  # fmt: skip
        done = subprocess.run(command, env=environment(tree), cwd=tree, capture_output=True,
                              text=True, timeout=900)  # fmt: skip
        if done.returncode != 0:
            raise RuntimeError(f"{tree}: {command} failed:\n{(done.stdout + done.stderr)[-3000:]}")
        return float(json.loads((Path(output) / "summary.json").read_text())["images_per_second"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("rev", help="the commit to compare with (a hash, a tag, HEAD~3)")
    parser.add_argument("--pairs", type=int, default=2)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    commit = subprocess.run(["git", "rev-parse", "--short", args.rev], cwd=ROOT, check=True,
                            capture_output=True, text=True).stdout.strip()  # fmt: skip
    figures: dict[str, dict[str, list[float]]] = {
        f: {"this tree": [], commit: []} for f in FRAMEWORKS
    }
    with tempfile.TemporaryDirectory() as directory:
        other = Path(directory) / commit
        subprocess.run(["git", "worktree", "add", "--detach", str(other), commit], cwd=ROOT,
                       check=True, capture_output=True)  # fmt: skip
        try:
            for _ in range(args.pairs):
                for framework in FRAMEWORKS:
                    for name, tree in (("this tree", ROOT), (commit, other)):
                        figures[framework][name].append(images_per_second(tree, framework))
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(other)], cwd=ROOT,
                           check=True, capture_output=True)  # fmt: skip
    rows = [{"framework": framework, **runs,
             "over": round(max(runs["this tree"]) / max(runs[commit]), 3)}
            for framework, runs in figures.items()]  # fmt: skip
    result = {"machine": machine(), "against": commit, "pairs": args.pairs, "rows": rows}
    if args.json:
        print(json.dumps(result, indent=2))
        return
    for row in rows:
        print(f"{row['framework']}: this tree {row['this tree']}, {commit} {row[commit]} "
              f"images/s; best over best {row['over']:.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
