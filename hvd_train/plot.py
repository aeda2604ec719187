"""`hvd-train plot`: loss, accuracy and learning-rate curves of one or several runs, side by
side, against the epochs trained (so runs of different world sizes line up)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hvd_train.errors import UsageError

PANELS = ("loss", "test accuracy", "learning rate")


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
    """Draws the runs' curves into `output` (PNG): one panel per metric, one line (or two, for
    the loss: training and test) per run. Returns the panels' titles."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed
    from matplotlib import pyplot as plt

    figure, axes = plt.subplots(1, len(PANELS), figsize=(5 * len(PANELS), 4), layout="constrained")
    for run in runs:
        label, records = read_run(run)
        train = [r for r in records if r["kind"] == "train"]
        test = [r for r in records if r["kind"] == "eval"]
        line = axes[0].plot([r["epochs"] for r in train], [r["loss"] for r in train], label=label)
        color = line[0].get_color()
        axes[0].plot([r["epochs"] for r in test], [r["test_loss"] for r in test], "o--",
                     color=color, label=f"{label}, test")  # fmt: skip
        axes[1].plot([r["epochs"] for r in test], [100 * r["test_accuracy"] for r in test],
                     "o-", color=color, label=label)  # fmt: skip
        axes[2].plot([r["epochs"] for r in train], [r["learning_rate"] for r in train],
                     color=color, label=label)  # fmt: skip
    for axis, title, unit in zip(axes, PANELS, ("", "%", ""), strict=True):
        axis.set_title(title)
        axis.set_xlabel("epochs")
        axis.set_ylabel(f"{title} ({unit})" if unit else title)
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
