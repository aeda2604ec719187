"""Rank 0's record of a run: `metrics.jsonl` (one JSON object per logged step and evaluation),
TensorBoard event files beside it, the trackers' copies (`trackers.py`), and `summary.json`.
Every rank holds a writer; only the current rank 0's writes (`enabled`, which an elastic job
moves when rank 0 changes).

Each record carries `samples`, the training examples seen since the run began, and `epochs`,
the same in epochs: unlike step numbers they mean the same whatever the world size, so records
after a point the run goes back to (a resume, an elastic rollback) can be dropped, and curves of
different runs line up. TensorBoard's step is `samples` for the same reasons.
"""

from __future__ import annotations

import errno
import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hvd_train.errors import UsageError
from hvd_train.frameworks import FRAMEWORKS
from hvd_train.training.trackers import Trackers

# metrics.jsonl keys -> TensorBoard tags; an evaluation's `test_<name>` is `test/<name>`, and
# `val_<name>` is `val/<name>`
TAGS = {
    "loss": "train/loss",
    "learning_rate": "train/learning_rate",
    "images_per_second": "speed/images_per_second",
    "step_ms": "speed/step_ms",
}


def write_error(path: Path, error: OSError) -> str:
    return (
        f"cannot write {path} ({error.strerror or error}); free space or fix the folder's "
        "permissions, or choose another --output-dir (the checkpoints written so far are intact)"
    )


def _summary_writer_class() -> Any:
    """tensorboardX's SummaryWriter. Its module imports torch, where installed, only to accept
    torch tensors: seconds of a TensorFlow run's start and torch's libraries beside TensorFlow's.
    The frameworks not loaded yet are hidden from that import (the records are floats)."""
    hidden = [f.module for f in FRAMEWORKS.values() if f.module not in sys.modules]
    for module in hidden:
        sys.modules[module] = None  # type: ignore[assignment]  # an import of it fails
    try:
        from tensorboardX import SummaryWriter
    finally:
        for module in hidden:
            del sys.modules[module]
    return SummaryWriter


class MetricsWriter:
    def __init__(self, output_dir: Path, train_size: int, trackers: Trackers | None = None,
                 settings: Mapping[str, Any] | None = None) -> None:  # fmt: skip
        """`trackers` take each record too, starting with the first, with the effective
        recipe `settings`."""
        self.path, self.train_size = output_dir / "metrics.jsonl", train_size
        self.trackers, self.settings = trackers or Trackers(()), settings or {}
        self.tracking = False  # the trackers started
        self.enabled = False  # set by the trainer on the rank that writes
        self.failure: str | None = None  # the first write that failed; training then stops
        self.board: Any = None  # TensorBoard's writer, opened at the first record
        self.purge_from: int | None = None  # TensorBoard drops the events from this step on

    def _append(self, record: dict[str, Any]) -> None:
        if not self.enabled or self.failure:
            return
        record["epochs"] = round(record["samples"] / self.train_size, 4)
        try:
            with self.path.open("a") as out:
                out.write(json.dumps(record) + "\n")
            self._board(record)
        except OSError as error:
            self.failure = write_error(self.path, error)
            return
        if not self.tracking:
            self.tracking = True
            self.trackers.call("start", self.path.parent, self.settings)
        self.trackers.call("record", record)

    def _board(self, record: dict[str, Any]) -> None:
        if self.board is None:
            SummaryWriter = _summary_writer_class()
            if not self.path.parent.is_dir():  # gone: do not let TensorBoard make it anew
                raise FileNotFoundError(errno.ENOENT, "No such file or directory")

            self.board = SummaryWriter(str(self.path.parent), purge_step=self.purge_from)
        for key, value in record.items():
            evaluated = key.startswith(("test_", "val_"))
            tag = TAGS.get(key) or (key.replace("_", "/", 1) if evaluated else None)
            if tag:
                self.board.add_scalar(tag, value, record["samples"])
        self.board.flush()

    def train(self, epoch: int, step: int, samples: int, loss: float, learning_rates: list[float],
              images_per_second: float, step_ms: float) -> None:  # fmt: skip
        """The loss averaged across ranks over the steps up to global step `step` (1-based),
        the learning rate of each of those steps (the last as `learning_rate`), and the speed
        over them."""
        self._append({"kind": "train", "epoch": epoch, "step": step, "samples": samples,
                      "loss": loss, "learning_rate": learning_rates[-1],
                      "learning_rates": learning_rates,
                      "images_per_second": round(images_per_second, 1),
                      "step_ms": round(step_ms, 2)})  # fmt: skip

    def eval(self, epoch: int, step: int, samples: int, figures: Mapping[str, float]) -> None:
        """An evaluation's loss and metrics, named as evaluated (`test_loss`, ...)."""
        self._append({"kind": "eval", "epoch": epoch, "step": step, "samples": samples,
                      **figures})  # fmt: skip

    def keep_until(self, samples: int) -> None:
        """Drops the records after `samples`: the run goes back there and records them anew."""
        if not self.enabled:
            return
        self.close()
        self.purge_from = samples + 1
        if not self.path.exists():
            return
        try:
            records = [json.loads(line) for line in self.path.read_text().splitlines() if line]
            kept = [r for r in records if r.get("samples", 0) <= samples]
            if len(kept) < len(records):
                self.path.write_text("".join(json.dumps(r) + "\n" for r in kept))
        except (OSError, ValueError) as error:
            raise UsageError(f"cannot rewrite {self.path} ({error}); move it aside") from None

    def close(self) -> None:
        if self.board is not None:
            self.board.close()
            self.board = None


def write_summary(output_dir: Path, summary: dict[str, Any]) -> None:
    """summary.json, the run's figures at its end."""
    path = output_dir / "summary.json"
    try:
        path.write_text(json.dumps(summary, indent=2) + "\n")
    except OSError as error:
        raise UsageError(write_error(path, error)) from None
