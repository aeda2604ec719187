"""Rank 0's record of a run: `metrics.jsonl` (one JSON object per logged step and evaluation)
and `summary.json`. Every rank holds a writer; only rank 0's writes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


class MetricsWriter:
    def __init__(self, output_dir: Path, enabled: bool) -> None:
        self.output_dir, self.enabled = output_dir, enabled

    def _append(self, record: dict[str, Any]) -> None:
        if self.enabled:
            with (self.output_dir / "metrics.jsonl").open("a") as out:
                out.write(json.dumps(record) + "\n")

    def train(self, epoch: int, step: int, loss: float, learning_rate: float) -> None:
        """The loss averaged across ranks over the steps up to global step `step` (1-based)."""
        self._append({"kind": "train", "epoch": epoch, "step": step, "loss": loss,
                      "learning_rate": learning_rate})  # fmt: skip

    def eval(self, epoch: int, step: int, test_loss: float, test_accuracy: float) -> None:
        self._append({"kind": "eval", "epoch": epoch, "step": step, "test_loss": test_loss,
                      "test_accuracy": test_accuracy})  # fmt: skip

    def summary(self, summary: dict[str, Any]) -> None:
        if self.enabled:
            (self.output_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
