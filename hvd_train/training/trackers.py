"""Trackers: rank 0's records sent on as they are written (`--track mlflow`, `--track csv`),
beside `metrics.jsonl` and TensorBoard, which stay the run's own record.

A tracker that fails (a server that is down or refuses) says so in one warning line and is
dropped: training goes on, and the records are kept locally.
"""

from __future__ import annotations

import csv
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tqdm import tqdm

# Where the tracking server does not answer, MLflow's client retries for minutes by default;
# a few seconds, unless the user says otherwise, then the run goes on without it.
MLFLOW_DEFAULTS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1", "MLFLOW_HTTP_REQUEST_TIMEOUT": "10"}
# The records' figures a tracker takes as metrics (their positions are its steps).
NOT_FIGURES = ("kind", "epoch", "step", "learning_rates")


class Tracker:
    """Does nothing; a tracker overrides what it needs. Called on rank 0 only."""

    name = ""

    def start(self, folder: Path, settings: Mapping[str, Any]) -> None:
        """The run in `folder` starts, with the effective recipe `settings` (nested tables)."""

    def record(self, record: Mapping[str, Any]) -> None:
        """A record as metrics.jsonl holds it."""

    def finish(self, folder: Path, kept: tuple[str, Path] | None) -> None:
        """The run ended: summary.json and curves.png are written; `kept` is the checkpoint the
        run keeps to hand on, its best ("best") or else its newest ("checkpoint")."""


class CsvTracker(Tracker):
    """`metrics.csv` beside metrics.jsonl: one row per record, one column per key any record
    had (so a spreadsheet reads it), rewritten as records come."""

    name = "csv"

    def start(self, folder: Path, settings: Mapping[str, Any]) -> None:
        self.path = folder / "metrics.csv"
        self.rows: list[dict[str, Any]] = []

    def record(self, record: Mapping[str, Any]) -> None:
        self.rows.append({k: v for k, v in record.items() if k != "learning_rates"})
        columns = list(dict.fromkeys(key for row in self.rows for key in row))
        with self.path.open("w", newline="") as out:
            writer = csv.DictWriter(out, columns)
            writer.writeheader()
            writer.writerows(self.rows)


class MlflowTracker(Tracker):
    """An MLflow run at `MLFLOW_TRACKING_URI` (MLflow's default: ./mlruns), in
    `MLFLOW_EXPERIMENT_NAME`'s experiment if set: the effective recipe as its parameters,
    every record's figures as metrics at the record's global step, and at the end summary.json,
    curves.png and a checkpoint as its artifacts: the best (under `best/`) where the recipe
    keeps some, else the newest (under `checkpoint/`)."""

    name = "mlflow"

    def start(self, folder: Path, settings: Mapping[str, Any]) -> None:
        for key, value in MLFLOW_DEFAULTS.items():
            os.environ.setdefault(key, value)
        import mlflow

        self.mlflow = mlflow
        mlflow.start_run(run_name=folder.name)
        mlflow.log_params({key: str(value)[:6000] for key, value in flattened(settings).items()})

    def record(self, record: Mapping[str, Any]) -> None:
        figures = {key: float(value) for key, value in record.items()
                   if key not in NOT_FIGURES and isinstance(value, int | float)}  # fmt: skip
        self.mlflow.log_metrics(figures, step=int(record["step"]))

    def finish(self, folder: Path, kept: tuple[str, Path] | None) -> None:
        for name in ("summary.json", "curves.png"):
            if (folder / name).exists():
                self.mlflow.log_artifact(str(folder / name))
        if kept is not None:
            kind, path = kept
            self.mlflow.log_artifacts(str(path), artifact_path=f"{kind}/{path.name}")
        self.mlflow.end_run()


def flattened(table: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested tables as `section.key` parameters."""
    flat: dict[str, Any] = {}
    for key, value in table.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            flat |= flattened(value, f"{name}.")
        else:
            flat[name] = value
    return flat


class Trackers:
    """The run's trackers, each called only while it works: the first failure of one is a
    warning line, and it is dropped."""

    def __init__(self, names: tuple[str, ...]) -> None:
        made = {"mlflow": MlflowTracker, "csv": CsvTracker}
        self.trackers: list[Tracker] = [made[name]() for name in names]

    def call(self, method: str, *arguments: Any) -> None:
        for tracker in list(self.trackers):
            try:
                getattr(tracker, method)(*arguments)
            except Exception as error:
                self.trackers.remove(tracker)
                reason = next(iter(str(error).splitlines()), "") or type(error).__name__
                shown = reason if len(reason) <= 200 else f"{reason[:200]}..."
                tqdm.write(
                    f"hvd-train: warning: the {tracker.name} tracker failed ({shown}); "
                    "training goes on without it, and the records stay in metrics.jsonl"
                )
