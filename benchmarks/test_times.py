"""What `make test` and `make test-quick` cost, read from their output: pytest's closing line
and its `--durations` table (pyproject.toml asks for the 25 slowest). Prints one JSON object,
which docs/results/test-times.json holds; the README and docs/testing.md show it
(`python -m benchmarks.render`).

    make test > test.log 2>&1; make test-quick > quick.log 2>&1
    python -m benchmarks.test_times test.log quick.log > docs/results/test-times.json
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from benchmarks.run import machine

CLOSING = re.compile(r"=+ (?P<counts>\d+ passed.*) in (?P<seconds>[\d.]+)s")
DURATION = re.compile(r"^(?P<seconds>[\d.]+)s call\s+(?P<test>\S+)$", re.MULTILINE)


def read(log: Path) -> dict:
    text = log.read_text()
    closing = CLOSING.search(text)
    if closing is None:
        raise SystemExit(f"{log}: no pytest closing line; pass the output of a finished run")
    slowest = [{"test": m["test"], "seconds": float(m["seconds"])} for m in DURATION.finditer(text)]
    return {"counts": closing["counts"], "seconds": float(closing["seconds"]), "slowest": slowest}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("test_log", type=Path, help="the output of make test")
    parser.add_argument("quick_log", type=Path, help="the output of make test-quick")
    args = parser.parse_args()
    figures = {"machine": machine(), "test": read(args.test_log), "quick": read(args.quick_log)}
    print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
