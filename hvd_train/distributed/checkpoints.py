"""The one checkpoint path, for hvd_train's trainer and for a loop of one's own alike: `save`
writes the model, the optimizer and the loop's own values into a run's `checkpoints/` (or, ranked
by a watched figure, its `best/`), in the format `checkpoint_files.py` keeps (atomic, with
checksums); `find` reads one back (the newest sound one, the best, or one named), setting a
damaged one aside with one line; `load` puts it into the model and the optimizer, on every rank.
`hvd-train eval` and `export` read through the same calls."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hvd_train.distributed.checkpoint_files import (
    BEST,
    STATE_FILE,
    Arrays,
    Checkpoint,
    best_checkpoint,
    best_checkpoints,
    check_weights_fit,
    checkpoint_name,
    checkpoints,
    load_checkpoint,
    load_newest_valid,
    remove_partial,
    save_checkpoint,
    set_aside_later,
)
from hvd_train.distributed.collectives import Collectives
from hvd_train.distributed.exchange import Exchange
from hvd_train.errors import UsageError
from hvd_train.recipe import Recipe
from hvd_train.recipe.toml import recipe_toml
from hvd_train.version import __version__

RESERVED = ("model", "optimizer")  # the keys of a saved state that are not the loop's own


def _as_saved(weights: Arrays) -> Arrays:
    return weights


def _as_given(saved: Arrays, current: Arrays) -> Arrays:
    return saved


@dataclass(frozen=True)
class Layout:
    """How a checkpoint holds a model's weights: `name`, recorded in the checkpoint ("neutral"
    for a TOML recipe's layer list, which moves between frameworks; else the backend's own,
    "torch" or "keras"), and the conversion from the backend's weights (`to_saved`) and back
    (`from_saved`, which takes what the saved layout lacks from the model's current weights)."""

    name: str
    to_saved: Callable[[Arrays], Arrays] = _as_saved
    from_saved: Callable[[Arrays, Arrays], Arrays] = _as_given


@dataclass(frozen=True)
class Best:
    """Where `save` keeps the `keep` best checkpoints by a watched figure: its name, its value
    at this point, and whether lower ("min") or higher ("max") is better."""

    monitor: str
    value: float
    mode: str
    keep: int

    @property
    def sign(self) -> float:
        return 1.0 if self.mode == "min" else -1.0


@dataclass(frozen=True)
class Found:
    """A checkpoint `find` read: its path, its state.json and recipe text on every rank, and
    its tensors on the rank that read it (rank 0, or every rank where each read it itself)."""

    path: Path
    state: dict[str, Any]
    recipe_text: str
    checkpoint: Checkpoint | None

    @property
    def values(self) -> dict[str, Any]:
        """The loop's own values saved with it (the trainer's position, seed, callbacks' state;
        checkpoints of hvd_train 0.2.0's trainer held them among state.json's own keys)."""
        return dict(self.state.get("loop", self.state))


def saved_framework(run: Path) -> str | None:
    """The framework of the run's newest checkpoint, if this rank can read it (before the
    layer exists: the default of --framework when resuming)."""
    found = checkpoints(run / "checkpoints")
    try:
        return str(json.loads((found[-1] / STATE_FILE).read_text())["framework"])
    except (IndexError, OSError, ValueError, KeyError, TypeError):
        return None


class CheckpointIO:
    def __init__(self, exchange: Exchange, collectives: Collectives) -> None:
        self.exchange, self.collectives = exchange, collectives
        self.layout: Layout | None = None  # the set-up model's (`setup`): the backend's own
        self.global_batch = 0  # of the last training loader: a saved step's examples

    def save(self, directory: str | Path, state: dict[str, Any], *,
             recipe: str | Path | Recipe | None = None, keep: int = 3,
             best: Best | None = None) -> Path | None:  # fmt: skip
        """Saves `state` into `directory`'s checkpoints/ (every rank calls it; rank 0 writes,
        atomically, with checksums, keeping the newest `keep`): its "model" and "optimizer"
        (the ones `setup` returned), and the loop's own values beside them (numbers, strings,
        lists, dicts), which every rank must hold alike. "epoch" and "step" (the steps done in
        it) name the checkpoint. `recipe`: the recipe that made the model (a `Recipe`, or a
        Python recipe file), for `--resume`, `hvd-train eval` and `export` to make it again.
        With `best`, into `directory`'s best/ instead, if its figure ranks among the `keep`
        best there (the one that falls out is dropped). Its path, on every rank (None where it
        did not rank)."""
        exchange = self.exchange
        exchange.needs_setup("save")
        if state.get("model") is not exchange.model or state.get("optimizer") is not (
            exchange.optimizer
        ):
            raise UsageError(
                'save: state["model"] and state["optimizer"] must be the ones setup returned'
            )
        values = {key: value for key, value in state.items() if key not in RESERVED}
        text = _loop_values(values)
        for rank, theirs in enumerate(self.collectives.all_gather(text)):
            if theirs != text:
                raise UsageError(
                    f"save: rank {rank} saves other values than rank 0 ({theirs} against "
                    f"{text}); save what every rank holds alike",
                    every_rank=True,
                )
        epoch, step = int(values.get("epoch", 0)), int(values.get("step", 0))
        samples = step * self.global_batch
        saved = {
            "epoch": epoch, "step_in_epoch": step, "samples_in_epoch": samples,
            "world_size": self.exchange.backend.world_size,
            "global_batch_size": self.global_batch, **_recipe_fields(recipe),
            "layout": self._layout().name, "framework": exchange.backend.name,
            "hvd_train_version": __version__, "loop": values,
        }  # fmt: skip
        text = recipe_toml(recipe) if isinstance(recipe, Recipe) else ""
        held = exchange.saved_state()
        name = checkpoint_name(epoch, samples)

        def write(folder: Path, kept: int, metadata: dict[str, Any]) -> Path:
            assert held is not None  # on rank 0
            weights = self._layout().to_saved(held.weights)
            return save_checkpoint(folder, name, weights, held.optimizer, metadata, text, kept)

        if best is None:
            return self.collectives.on_rank_zero(
                lambda: write(Path(directory) / "checkpoints", keep, saved)
            )
        ranked = saved | {"monitored": {"name": best.monitor, "value": best.value,
                                        "mode": best.mode}}  # fmt: skip

        def keep_if_best() -> Path | None:
            folder = Path(directory) / BEST
            kept = sorted(best_checkpoints(folder), key=lambda entry: best.sign * entry[1])
            full = len(kept) >= best.keep
            if full and not best.sign * best.value < best.sign * kept[-1][1]:
                return None
            path = write(folder, len(kept) + 1, ranked)
            for old, _ in kept[best.keep - 1 :]:
                if old != path:  # an evaluation of the same point again (an elastic rollback)
                    shutil.rmtree(old, ignore_errors=True)
            return path

        return self.collectives.on_rank_zero(keep_if_best)

    def find(self, path: str | Path, *, which: str = "latest",
             everywhere: bool = False) -> Found | None:  # fmt: skip
        """The checkpoint at `path`, read by rank 0 (every rank knows its state and recipe, rank
        0 its tensors too; with `everywhere`, each rank reads it itself, with no collective, as
        an elastic job's joining worker must): `path` itself where it is one; else the newest
        sound one of the run at `path` (`which` "latest": a damaged newer one is set aside with
        one line, and the one before used; None where there is none), or its best one
        (`which` "best", or `path` a run's best/ folder)."""

        held: list[Checkpoint] = []

        def read() -> tuple[Path, dict[str, Any], str] | None:
            checkpoint = _read(Path(path), which)
            if checkpoint is None:
                return None
            held.append(checkpoint)
            return checkpoint.path, checkpoint.state, checkpoint.recipe_text

        shared = read() if everywhere else self.collectives.on_rank_zero(read)
        if shared is None:
            return None
        return Found(*shared, checkpoint=held[0] if held else None)

    def load(self, found: Found, *, remedy: str, optimizer: bool = True,
             broadcast: bool = True) -> None:  # fmt: skip
        """Loads `found`'s weights (and its optimizer state, where asked) into the set-up
        model and optimizer on the rank that read it, once they are known to fit (`remedy`:
        what a misfit's line tells the user to do), then (`broadcast`) into every rank's."""
        exchange = self.exchange
        exchange.needs_setup("load")

        def load_here() -> None:
            checkpoint = found.checkpoint
            assert checkpoint is not None, "read on this rank"
            layout = self._layout()
            current = exchange.state(optimizer=False).weights
            check_weights_fit(checkpoint, layout.to_saved(current), remedy)
            exchange.load_state(weights=layout.from_saved(checkpoint.weights, current))
            if not optimizer:
                return
            try:
                exchange.load_state(optimizer=checkpoint.optimizer)
            except (ValueError, KeyError, RuntimeError) as error:
                raise UsageError(
                    f"checkpoint {checkpoint.path}'s optimizer state does not fit this "
                    f"optimizer ({error}); {remedy}"
                ) from None

        self.collectives.on_rank_zero(load_here)
        if broadcast:
            exchange.backend.broadcast_state(include_optimizer=optimizer)

    def prepare(self, run: Path, resume: bool) -> None:
        """Rank 0 makes the run's folder, removes what a killed writer left half-written, and
        refuses to write over an earlier run's checkpoints (unless it `resume`s it)."""

        def prepare_here() -> None:
            try:
                (run / "checkpoints").mkdir(parents=True, exist_ok=True)
                probe = run / f".write-test-{time.time_ns()}"
                probe.touch()
                probe.unlink()
                remove_partial(run / "checkpoints")
                remove_partial(run / BEST)
            except OSError as error:
                raise UsageError(
                    f"cannot write to output directory {run} ({error.strerror}); "
                    "choose another --output-dir"
                ) from None
            if not resume and (checkpoints(run / "checkpoints") or checkpoints(run / BEST)):
                raise UsageError(
                    f"{run} already holds checkpoints; pass --resume to continue that run "
                    "or choose another --output-dir"
                )

        self.collectives.on_rank_zero(prepare_here)

    def set_aside_after(self, found: Found) -> Path | None:
        """Where a run goes back to one of its best checkpoints (`found`), rank 0 moves the
        run's later checkpoints aside (with a copy of its records) into a `set-aside-<time>/`
        folder, which it names; None where nothing was later."""
        if found.path.parent.name != BEST:
            return None
        return self.collectives.on_rank_zero(
            lambda: set_aside_later(found.path.parent.parent, found.path.name)
        )

    def kept(self, run: Path) -> tuple[str, Path] | None:
        """The checkpoint a run keeps to hand on (to a tracker): its best ("best"), else its
        newest ("checkpoint"); None where it has none. Read on this rank."""
        if chosen := best_checkpoint(run / BEST):
            return "best", chosen
        newest = checkpoints(run / "checkpoints")
        return ("checkpoint", newest[-1]) if newest else None

    def _layout(self) -> Layout:
        return self.layout or Layout(self.exchange.layout)


def _read(path: Path, which: str) -> Checkpoint | None:
    """What `find` reads on one rank."""
    if (path / STATE_FILE).is_file():
        return load_checkpoint(path)
    if which == "best" or path.name == BEST:
        folder = path if path.name == BEST else path / BEST
        chosen = best_checkpoint(folder)
        if chosen is None:
            raise UsageError(
                f"nothing to resume from: {folder} holds no checkpoint (the recipe keeps "
                "the best with [checkpoints] keep_best); use --resume latest"
            )
        return load_checkpoint(chosen)
    return load_newest_valid(path / "checkpoints")


def _recipe_fields(recipe: str | Path | Recipe | None) -> dict[str, Any]:
    """What state.json says of the recipe that made the model."""
    if isinstance(recipe, Recipe):
        return {"recipe": recipe.name, "recipe_source": recipe.source,
                "recipe_hash": recipe.recipe_hash()}  # fmt: skip
    return {"recipe": Path(recipe).stem if recipe else "own loop",
            "recipe_source": str(Path(recipe).resolve()) if recipe else ""}  # fmt: skip


def _loop_values(values: dict[str, Any]) -> str:
    """The loop's own saved values as state.json holds them; one line where it cannot."""
    try:
        return json.dumps(values, sort_keys=True, allow_nan=False)
    except (TypeError, ValueError) as error:
        raise UsageError(
            f"save: the loop's values cannot be saved ({error}); give numbers, strings, lists "
            "and dicts beside the model and the optimizer"
        ) from None
