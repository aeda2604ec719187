"""`hvd-train plot`: loss, metric and learning-rate curves of one or several runs, side by
side, against the epochs trained (so runs of different world sizes line up)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hvd_train.errors import UsageError
from hvd_train.recipe.scoring import PERCENT

SPLITS = ("test_", "val_")  # the evaluations' figures, by the split they measure


def metric_names(runs: list[list[dict[str, Any]]]) -> list[str]:
    """The metrics the runs' evaluations recorded (`test_<name>` or `val_<name>`, the loss
    aside), in the order first seen."""
    names = {key.split("_", 1)[1]: None for records in runs for record in records
             if record["kind"] == "eval" for key in record
             if key.startswith(SPLITS) and not key.endswith("_loss")}  # fmt: skip
    return list(names)


def read_run(run: Path) -> tuple[str, list[dict[str, Any]]]:
    """A run's label (recipe, framework, world size) and its metrics records."""
    try:
        lines = (run / "metrics.jsonl").read_text().splitlines()
        records = [json.loads(line) for line in lines if line.strip()]
    except (OSError, ValueError) as error:
        raise UsageError(
            f"cannot read {run / 'metrics.jsonl'} ({error}); give the --output-dir of a run"
        ) from None
    label = run.name
    summary = run / "summary.json"
    if summary.exists():
        facts = json.loads(summary.read_text())
        label = f"{facts['recipe']}, {facts['framework']}, np={facts['world_size']} ({run.name})"
    return label, records


def plot_runs(runs: list[Path], output: Path) -> list[str]:
    """Draws the runs' curves into `output` (PNG): the loss (training and test), each metric
    the evaluations recorded, and the learning rate; one line per run in each panel. Returns
    the panels' titles."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed
    from matplotlib import pyplot as plt

    read = [read_run(run) for run in runs]
    metrics = metric_names([records for _, records in read])
    panels = ["loss", *(name.replace("_", " ") for name in metrics), "learning rate"]
    figure, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4), layout="constrained")
    for label, records in read:
        draw_run(axes, label, records, metrics)
    for axis, title, name in zip(axes, panels, ["", *metrics, ""], strict=True):
        axis.set_title(title)
        axis.set_xlabel("epochs")
        axis.set_ylabel(f"{title} (%)" if name in PERCENT else title)
        axis.grid(alpha=0.3)
    axes[0].set_yscale("log")
    axes[0].legend(fontsize="small")
    try:
        figure.savefig(output, dpi=100)
    except OSError as error:
        raise UsageError(f"cannot write {output} ({error.strerror}); choose another -o") from None
    finally:
        plt.close(figure)
    return [axis.get_title() for axis in axes]


def draw_run(axes: Any, label: str, records: list[dict[str, Any]], metrics: list[str]) -> None:
    """One run's lines, in one colour: its loss, `metrics` and learning rate, panel by panel."""
    train = [r for r in records if r["kind"] == "train"]
    evaluations = [r for r in records if r["kind"] == "eval"]
    line = axes[0].plot([r["epochs"] for r in train], [r["loss"] for r in train], label=label)
    color = line[0].get_color()
    for split, style in zip(SPLITS, ("o--", "x:"), strict=True):  # the test set's, validation's
        for axis, name in zip(axes[:-1], ["loss", *metrics], strict=True):
            scale = 100 if name in PERCENT else 1
            key = f"{split}{name}"
            shown = [r for r in evaluations if key in r]
            if shown:
                axis.plot([r["epochs"] for r in shown], [scale * r[key] for r in shown], style,
                          color=color, label=f"{label}, {split[:-1]}")  # fmt: skip
    axes[-1].plot([r["epochs"] for r in train], [r["learning_rate"] for r in train],
                  color=color, label=label)  # fmt: skip
