"""The framework-neutral training loop: data shards, schedule, evaluation, checkpoints, metrics.

It talks to the framework only through an Adapter. Rank 0 alone writes files and shows
progress; every rank runs the same number of steps and collectives.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from hvd_train import __version__
from hvd_train.adapters import Adapter, create_adapter
from hvd_train.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from hvd_train.errors import UsageError
from hvd_train.evaluation import evaluate
from hvd_train.mnist import Mnist, load_mnist
from hvd_train.recipe import Recipe
from hvd_train.schedule import LearningRateSchedule
from hvd_train.sharding import epoch_order, shard_batches, steps_per_epoch


@dataclass(frozen=True)
class RunOptions:
    recipe: Recipe
    framework: str
    seed: int
    data_dir: Path | None
    output_dir: Path
    resume: bool
    log_every: int
    limit_steps: int | None = None  # cap on steps per epoch, for smoke runs


def prepare_output_dir(output_dir: Path, resume: bool) -> None:
    """Creates the run directory; refuses to write over an earlier run's checkpoints."""
    try:
        (output_dir / "checkpoints").mkdir(parents=True, exist_ok=True)
        probe = output_dir / f".write-test-{time.time_ns()}"
        probe.touch()
        probe.unlink()
    except OSError as error:
        raise UsageError(
            f"cannot write to output directory {output_dir} ({error.strerror}); "
            "choose another --output-dir"
        ) from None
    if not resume and latest_checkpoint(output_dir / "checkpoints") is not None:
        raise UsageError(
            f"{output_dir} already holds checkpoints; pass --resume to continue that run "
            "or choose another --output-dir"
        )


def restore(adapter: Adapter, options: RunOptions) -> int:
    """Loads the newest checkpoint of the run into rank 0's model; the epochs it completed."""
    path = latest_checkpoint(options.output_dir / "checkpoints")
    if path is None:
        raise UsageError(
            f"nothing to resume: {options.output_dir / 'checkpoints'} holds no checkpoint; "
            "leave out --resume to start a new run"
        )
    checkpoint = load_checkpoint(path)
    state = checkpoint.state
    if state.get("architecture") != options.recipe.architecture_hash():
        raise UsageError(
            f"checkpoint {path} was written for another model (recipe {state.get('recipe')!r}); "
            "resume with that recipe or choose another --output-dir"
        )
    if state.get("framework") != adapter.name:
        raise UsageError(
            f"checkpoint {path} was written by {state.get('framework')}; "
            f"resume it with --framework {state.get('framework')}"
        )
    if state["epoch"] >= options.recipe.schedule.epochs:
        raise UsageError(
            f"the run in {options.output_dir} already finished {state['epoch']} epochs; "
            "raise --epochs to train further"
        )
    adapter.load_weights(checkpoint.weights)
    adapter.load_optimizer_state(checkpoint.optimizer)
    print(f"hvd-train: resuming from {path}", flush=True)
    return int(state["epoch"])


class Trainer:
    def __init__(self, adapter: Adapter, data: Mnist, options: RunOptions) -> None:
        self.adapter, self.data, self.options = adapter, data, options
        self.recipe = options.recipe
        batch_size = self.recipe.schedule.batch_size
        self.steps = min(
            steps_per_epoch(len(data.train_labels), adapter.world_size, batch_size),
            options.limit_steps or sys.maxsize,
        )
        self.schedule = LearningRateSchedule.from_recipe(
            self.recipe.schedule,
            self.recipe.optimizer.learning_rate,
            adapter.world_size,
            self.steps,
        )
        self.metrics_path = options.output_dir / "metrics.jsonl"
        self.images_trained = 0
        self.step_seconds = 0.0

    def log(self, record: dict[str, Any]) -> None:
        if self.adapter.is_rank_zero:
            with self.metrics_path.open("a") as out:
                out.write(json.dumps(record) + "\n")

    def run_epoch(self, epoch: int) -> float:
        """Trains one epoch; the loss averaged over ranks and steps."""
        adapter, data = self.adapter, self.data
        order = epoch_order(len(data.train_labels), self.options.seed, epoch)
        batches = shard_batches(
            order, adapter.rank, adapter.world_size, self.recipe.schedule.batch_size
        )[: self.steps]
        bar = tqdm(
            batches,
            desc=f"epoch {epoch + 1}/{self.recipe.schedule.epochs}",
            unit="step",
            disable=not adapter.is_rank_zero,
            leave=False,
            mininterval=0.5,
        )
        window, epoch_total = [], 0.0
        for index, batch in enumerate(bar):
            step = epoch * self.steps + index
            learning_rate = self.schedule(step)
            started = time.perf_counter()
            window.append(
                adapter.train_step(
                    data.train_images[batch], data.train_labels[batch], learning_rate
                )
            )
            self.step_seconds += time.perf_counter() - started
            self.images_trained += len(batch) * adapter.world_size
            if len(window) == self.options.log_every or index == len(batches) - 1:
                loss = float(adapter.allreduce_mean(np.array([np.mean(window)]))[0])
                epoch_total += loss * len(window)
                window = []
                bar.set_postfix(loss=f"{loss:.4f}", lr=f"{learning_rate:.2e}")
                self.log(
                    {
                        "kind": "train",
                        "epoch": epoch + 1,
                        "step": step + 1,
                        "loss": loss,
                        "learning_rate": learning_rate,
                    }
                )
        return epoch_total / len(batches)

    def training_state(self, epoch: int) -> dict[str, Any]:
        return {
            "epoch": epoch,
            "step": epoch * self.steps,
            "seed": self.options.seed,
            "world_size": self.adapter.world_size,
            "global_batch_size": self.recipe.schedule.batch_size * self.adapter.world_size,
            "learning_rate": {
                "base": self.schedule.base,
                "peak": self.schedule.peak,
                "scaling": self.recipe.schedule.lr_scaling,
            },
            "recipe": self.recipe.name,
            "recipe_hash": self.recipe.recipe_hash(),
            "architecture": self.recipe.architecture_hash(),
            "framework": self.adapter.name,
            "hvd_train_version": __version__,
        }

    def fit(self, start_epoch: int) -> dict[str, Any]:
        adapter, recipe = self.adapter, self.recipe
        test_loss = accuracy = float("nan")
        started = time.perf_counter()
        for epoch in range(start_epoch, recipe.schedule.epochs):
            epoch_started = time.perf_counter()
            train_loss = self.run_epoch(epoch)
            test_loss, accuracy = evaluate(adapter, self.data)
            self.log(
                {
                    "kind": "eval",
                    "epoch": epoch + 1,
                    "step": (epoch + 1) * self.steps,
                    "test_loss": test_loss,
                    "test_accuracy": accuracy,
                }
            )
            if adapter.is_rank_zero:
                save_checkpoint(
                    self.options.output_dir / "checkpoints",
                    epoch + 1,
                    adapter.weights(),
                    adapter.optimizer_state(),
                    self.training_state(epoch + 1),
                    recipe.text,
                )
                tqdm.write(
                    f"epoch {epoch + 1}/{recipe.schedule.epochs}: train loss {train_loss:.4f}, "
                    f"test loss {test_loss:.4f}, test accuracy {accuracy:.2%} "
                    f"({time.perf_counter() - epoch_started:.1f} s)"
                )
        train_seconds = time.perf_counter() - started
        return {
            "recipe": recipe.name,
            "framework": adapter.name,
            "world_size": adapter.world_size,
            "epochs": recipe.schedule.epochs,
            "global_batch_size": recipe.schedule.batch_size * adapter.world_size,
            "learning_rate": self.schedule.peak,
            "test_accuracy": accuracy,
            "test_loss": test_loss,
            "train_seconds": round(train_seconds, 2),
            "images_per_second": round(self.images_trained / self.step_seconds, 1),
            "hvd_train_version": __version__,
        }


def train(options: RunOptions) -> dict[str, Any]:
    """Runs one training job on this rank; the summary (written by rank 0)."""
    adapter = create_adapter(options.framework)
    adapter.init()
    adapter.on_rank_zero(lambda: prepare_output_dir(options.output_dir, options.resume))
    data = load_mnist(options.data_dir)
    adapter.build(options.recipe, options.seed)
    start_epoch = adapter.on_rank_zero(lambda: restore(adapter, options)) if options.resume else 0
    adapter.broadcast_state(include_optimizer=start_epoch > 0)
    summary = Trainer(adapter, data, options).fit(start_epoch)
    if adapter.is_rank_zero:
        (options.output_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary
