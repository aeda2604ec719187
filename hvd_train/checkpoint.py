"""Checkpoints: one directory per epoch, written on rank 0 only and atomically.

    checkpoints/epoch-0003/
        model.safetensors      weights in the framework-neutral layout (see adapters/base.py)
        optimizer.safetensors  optimizer state in the writing framework's layout
        state.json             epoch, step, seed, world size, recipe, framework, ...
        recipe.toml            the recipe the model was built from

A checkpoint is first written under a temporary name and renamed when complete, so a crash
never leaves a half-written `epoch-*` directory behind.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from safetensors import SafetensorError
from safetensors.numpy import load_file, save_file

from hvd_train.adapters.base import Arrays
from hvd_train.errors import UsageError

MODEL_FILE, OPTIMIZER_FILE = "model.safetensors", "optimizer.safetensors"
STATE_FILE, RECIPE_FILE = "state.json", "recipe.toml"


@dataclass(frozen=True)
class Checkpoint:
    path: Path
    weights: Arrays
    optimizer: Arrays
    state: dict[str, Any]
    recipe_text: str


def checkpoint_name(epoch: int) -> str:
    return f"epoch-{epoch:04d}"


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_checkpoint(
    directory: Path,
    epoch: int,
    weights: Arrays,
    optimizer: Arrays,
    state: dict[str, Any],
    recipe_text: str,
) -> Path:
    """Writes `directory/epoch-NNNN` atomically and returns its path."""
    final = directory / checkpoint_name(epoch)
    partial = directory / f".{final.name}.partial-{os.getpid()}"
    partial.mkdir(parents=True)
    try:
        save_file(weights, partial / MODEL_FILE)
        save_file(optimizer, partial / OPTIMIZER_FILE)
        (partial / STATE_FILE).write_text(json.dumps(state, indent=2) + "\n")
        (partial / RECIPE_FILE).write_text(recipe_text)
        for name in (MODEL_FILE, OPTIMIZER_FILE, STATE_FILE, RECIPE_FILE):
            _fsync(partial / name)
        partial.rename(final)
        _fsync(directory)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return final


def latest_checkpoint(directory: Path) -> Path | None:
    """The newest complete checkpoint in `directory`, if any."""
    found = sorted(directory.glob("epoch-[0-9][0-9][0-9][0-9]")) if directory.is_dir() else []
    return found[-1] if found else None


def resolve_checkpoint(path: Path) -> Path:
    """`path` itself if it is a checkpoint, else the newest checkpoint of the run it names."""
    if (path / STATE_FILE).is_file():
        return path
    latest = latest_checkpoint(path / "checkpoints")
    if latest is None:
        raise UsageError(
            f"{path} is neither a checkpoint nor a run directory holding one; "
            "pass checkpoints/epoch-NNNN of a run, or its --output-dir"
        )
    return latest


def load_checkpoint(path: Path) -> Checkpoint:
    """Reads a checkpoint directory; a missing or unreadable part is a UsageError."""
    try:
        return Checkpoint(
            path=path,
            weights=load_file(path / MODEL_FILE),
            optimizer=load_file(path / OPTIMIZER_FILE),
            state=json.loads((path / STATE_FILE).read_text()),
            recipe_text=(path / RECIPE_FILE).read_text(),
        )
    except (OSError, SafetensorError, json.JSONDecodeError) as error:
        raise UsageError(
            f"checkpoint {path} is unreadable ({error}); pass another checkpoint or start anew"
        ) from None
