"""Rank 0's record of a run: `metrics.jsonl` (one JSON object per logged step and evaluation)
and `summary.json`. Every rank holds a writer; only rank 0's writes.

Each record carries `samples`, the training examples seen since the run began: unlike step
numbers it means the same whatever the world size, so records after a point the run goes back
to (a resume, an elastic rollback) can be dropped, and curves of different runs line up.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hvd_train.errors import UsageError


def write_error(path: Path, error: OSError) -> str:
    return (
        f"cannot write {path} ({error.strerror or error}); free space or fix the folder's "
        "permissions, or choose another --output-dir (the checkpoints written so far are intact)"
    )


class MetricsWriter:
    def __init__(self, output_dir: Path, enabled: bool) -> None:
        self.path, self.enabled = output_dir / "metrics.jsonl", enabled
        self.failure: str | None = None  # the first write that failed; training then stops

    def _append(self, record: dict[str, Any]) -> None:
        if not self.enabled or self.failure:
            return
        try:
            with self.path.open("a") as out:
                out.write(json.dumps(record) + "\n")
        except OSError as error:
            self.failure = write_error(self.path, error)

    def train(self, epoch: int, step: int, samples: int, loss: float, learning_rate: float) -> None:
        """The loss averaged across ranks over the steps up to global step `step` (1-based)."""
        self._append({"kind": "train", "epoch": epoch, "step": step, "samples": samples,
                      "loss": loss, "learning_rate": learning_rate})  # fmt: skip

    def eval(
        self, epoch: int, step: int, samples: int, test_loss: float, test_accuracy: float
    ) -> None:
        self._append({"kind": "eval", "epoch": epoch, "step": step, "samples": samples,
                      "test_loss": test_loss, "test_accuracy": test_accuracy})  # fmt: skip

    def keep_until(self, samples: int) -> None:
        """Drops the records after `samples`: the run goes back there and records them anew."""
        if not self.enabled or not self.path.exists():
            return
        try:
            records = [json.loads(line) for line in self.path.read_text().splitlines() if line]
            kept = [r for r in records if r.get("samples", 0) <= samples]
            if len(kept) < len(records):
                self.path.write_text("".join(json.dumps(r) + "\n" for r in kept))
        except (OSError, ValueError) as error:
            raise UsageError(f"cannot rewrite {self.path} ({error}); move it aside") from None

    def summary(self, summary: dict[str, Any]) -> None:
        if not self.enabled:
            return
        path = self.path.with_name("summary.json")
        try:
            path.write_text(json.dumps(summary, indent=2) + "\n")
        except OSError as error:
            raise UsageError(write_error(path, error)) from None
