"""Checkpoints on disk: one directory per save, written on rank 0 only, atomically, with
checksums (`checkpoints.py` is the path every save and load takes).

    checkpoints/epoch-0002-sample-00007680/
        model.safetensors      weights in the recipe's layout: "neutral" for a TOML recipe
                               (see layers.py), else the model's own ("torch", "keras")
        optimizer.safetensors  optimizer state in the writing framework's layout
        recipe.toml            the effective recipe (after overrides) the run trained with
        state.json             position (epoch, step), seed, world size, recipe, layout,
                               framework, and the SHA-256 of each file above

A checkpoint is written under a temporary name, flushed, and renamed when complete, so a crash
never leaves a half-written checkpoint. A file damaged later fails its checksum. Names sort by
progress (epoch, then training samples consumed in it), whatever the world size was.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from safetensors import SafetensorError
from safetensors.numpy import load_file, save_file

from hvd_train.errors import UsageError

Arrays = dict[str, np.ndarray]  # weights (or optimizer state) by name
MODEL_FILE, OPTIMIZER_FILE = "model.safetensors", "optimizer.safetensors"
STATE_FILE, RECIPE_FILE = "state.json", "recipe.toml"
CHECKSUMMED = (MODEL_FILE, OPTIMIZER_FILE, RECIPE_FILE)


@dataclass(frozen=True)
class Checkpoint:
    path: Path
    weights: Arrays
    optimizer: Arrays
    state: dict[str, Any]
    recipe_text: str


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


BEST = "best"  # a run's folder of its best checkpoints, beside checkpoints/


def checkpoint_name(epoch: int, samples_in_epoch: int) -> str:
    return f"epoch-{epoch:04d}-sample-{samples_in_epoch:08d}"


def _state_checksum(state: dict[str, Any]) -> str:
    """The SHA-256 of state.json's own contents (all but this checksum), key order aside."""
    rest = {key: value for key, value in state.items() if key != "state_sha256"}
    return hashlib.sha256(json.dumps(rest, sort_keys=True).encode()).hexdigest()


def save_checkpoint(
    directory: Path,
    name: str,
    weights: Arrays,
    optimizer: Arrays,
    state: dict[str, Any],
    recipe_text: str,
    keep: int,
) -> Path:
    """Writes `directory/name` atomically, then keeps only the newest `keep`. A failed write
    (a full disk, a vanished folder) is a UsageError and leaves nothing behind."""
    final = directory / name
    partial = directory / f".{final.name}.partial-{os.getpid()}"
    try:
        partial.mkdir(parents=True)
        save_file(weights, partial / MODEL_FILE)
        save_file(optimizer, partial / OPTIMIZER_FILE)
        (partial / RECIPE_FILE).write_text(recipe_text)
        state = state | {"sha256": {name: _sha256(partial / name) for name in CHECKSUMMED}}
        state["state_sha256"] = _state_checksum(state)
        (partial / STATE_FILE).write_text(json.dumps(state, indent=2))
        for name in (*CHECKSUMMED, STATE_FILE):
            _fsync(partial / name)
        _replace(partial, final)
        _fsync(directory)
    except BaseException as error:
        shutil.rmtree(partial, ignore_errors=True)
        # safetensors reports its own I/O errors (a full disk) as SafetensorError.
        if isinstance(error, OSError | SafetensorError):
            reason = getattr(error, "strerror", None) or str(error).rsplit("I/O error: ", 1)[-1]
            raise UsageError(
                f"cannot write checkpoint {final} ({reason}); free space or fix the folder's "
                "permissions, or choose another --output-dir (the earlier checkpoints are intact)"
            ) from None
        raise
    for old in checkpoints(directory)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def _replace(partial: Path, final: Path) -> None:
    """Renames the finished `partial` to `final`. A run that went back (an elastic rollback)
    writes a point again: the old copy is moved aside first, then deleted."""
    if final.exists():
        aside = final.with_name(f".{final.name}.replaced-{os.getpid()}")
        final.rename(aside)
        partial.rename(final)
        shutil.rmtree(aside, ignore_errors=True)
    else:
        partial.rename(final)


def remove_partial(directory: Path) -> None:
    """Removes what a killed writer left half-written: `.…partial-<pid>` and
    `.…replaced-<pid>` folders (complete checkpoints never carry those names)."""
    for leftover in [*directory.glob(".*.partial-*"), *directory.glob(".*.replaced-*")]:
        shutil.rmtree(leftover, ignore_errors=True)


def checkpoints(directory: Path) -> list[Path]:
    """The complete checkpoints in `directory`, oldest first."""
    pattern = "epoch-" + "[0-9]" * 4 + "-sample-" + "[0-9]" * 8
    return sorted(directory.glob(pattern)) if directory.is_dir() else []


def best_checkpoints(folder: Path) -> list[tuple[Path, float]]:
    """The checkpoints in a run's `best/` folder, each with the watched figure it was kept
    for (one whose state cannot be read is left out: it ranks nowhere)."""
    found = []
    for path in checkpoints(folder):
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            found.append(
                (path, float(json.loads((path / STATE_FILE).read_text())["monitored"]["value"]))
            )
    return found


def best_checkpoint(folder: Path) -> Path | None:
    """The best of a run's `best/` folder, by the figure each was kept for; None if empty."""
    best = best_checkpoints(folder)
    if not best:
        return None
    mode = json.loads((best[0][0] / STATE_FILE).read_text())["monitored"]["mode"]
    sign = 1.0 if mode == "min" else -1.0
    return min(best, key=lambda entry: sign * entry[1])[0]


def load_checkpoint(path: Path) -> Checkpoint:
    """Reads and verifies a checkpoint; a missing, damaged or unreadable part is a UsageError."""
    remedy = "use an earlier checkpoint or start anew"
    try:
        state = json.loads((path / STATE_FILE).read_text())
        if state.get("state_sha256") != _state_checksum(state):
            raise UsageError(
                f"checkpoint {path} is corrupt (state.json fails its checksum); {remedy}"
            )
        if set(state["sha256"]) != set(CHECKSUMMED):
            raise UsageError(
                f"checkpoint {path} is corrupt (state.json lists other files); {remedy}"
            )
        for name, expected in state["sha256"].items():
            if _sha256(path / name) != expected:
                raise UsageError(
                    f"checkpoint {path} is corrupt ({name} fails its checksum); {remedy}"
                )
        return Checkpoint(
            path=path,
            weights=load_file(path / MODEL_FILE),
            optimizer=load_file(path / OPTIMIZER_FILE),
            state=state,
            recipe_text=(path / RECIPE_FILE).read_text(),
        )
    except (OSError, SafetensorError, ValueError, KeyError, TypeError, AttributeError) as error:
        raise UsageError(f"checkpoint {path} is unreadable ({error}); {remedy}") from None


def _describe(arrays: Arrays) -> dict[str, tuple[int, ...]]:
    return {name: tuple(array.shape) for name, array in arrays.items()}


def check_weights_fit(checkpoint: Checkpoint, weights: Arrays, remedy: str) -> None:
    """The checkpoint holds exactly the tensors of `weights` (the model's), shape for shape."""
    saved, wanted = _describe(checkpoint.weights), _describe(weights)
    if saved == wanted:
        return
    name = next(iter(sorted(set(saved) ^ set(wanted)) or
                     [n for n in wanted if saved[n] != wanted[n]]))  # fmt: skip
    there, here = saved.get(name, "absent"), wanted.get(name, "absent")
    raise UsageError(
        f"checkpoint {checkpoint.path} was written for another model (recipe "
        f"{checkpoint.state['recipe']!r}; {name}: {there} there, {here} here); {remedy}"
    )


def load_newest_valid(directory: Path) -> Checkpoint | None:
    """The newest checkpoint in `directory` that verifies. Damaged newer ones are reported and
    set aside as `<name>.corrupt` (not deleted: they may be worth a look), so that training
    can write a sound one under the same name again."""
    for path in reversed(checkpoints(directory)):
        try:
            return load_checkpoint(path)
        except UsageError as error:
            aside = path.with_name(f"{path.name}.corrupt")
            shutil.rmtree(aside, ignore_errors=True)  # an older damaged copy of the same point
            with contextlib.suppress(OSError):  # another rank of an elastic job was first
                path.rename(aside)
            print(
                f"hvd-train: {error}; set aside as {aside.name}, trying the one before",
                file=sys.stderr,
                flush=True,
            )
    return None


def set_aside_later(run: Path, name: str) -> Path | None:
    """Moves the run's checkpoints (newest and best) that are later than checkpoint `name`,
    with a copy of its records, into a new `set-aside-<time>/` folder of `run`: a run that
    goes back to its best checkpoint trains on from there, and what it trained after it stays
    on disk. The folder, or None where nothing was later."""
    later = [path for folder in (run / "checkpoints", run / BEST)
             for path in checkpoints(folder) if path.name > name]  # fmt: skip
    if not later:
        return None
    aside = run / time.strftime("set-aside-%Y%m%d-%H%M%S")
    for path in later:
        (aside / path.parent.name).mkdir(parents=True, exist_ok=True)
        path.rename(aside / path.parent.name / path.name)
    with contextlib.suppress(FileNotFoundError):
        shutil.copy2(run / "metrics.jsonl", aside / "metrics.jsonl")
    return aside
