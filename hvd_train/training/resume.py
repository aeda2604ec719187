"""What a resumed run takes from its checkpoint, and every check that the checkpoint fits: the
recipe as it trained (overrides included), the seed, and by default the framework. The user
types only `--resume --output-dir`; a flag that contradicts the checkpoint is refused, naming
the difference, except the safe changes: more epochs, another world size, how the ranks share
the optimizer's state out, and how the run is watched (logging, checkpoint frequency). `eval`
checks its checkpoint here too.
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

from hvd_train.checkpoint import (
    BEST,
    Checkpoint,
    best_checkpoint,
    checkpoints,
    load_checkpoint,
    load_newest_valid,
)
from hvd_train.distributed.frameworks import FRAMEWORKS
from hvd_train.distributed.layer import Distributed
from hvd_train.errors import UsageError
from hvd_train.recipe import Recipe, load_recipe
from hvd_train.recipe.settings import PYTHON_FUNCTION
from hvd_train.recipe.toml import parse_toml_recipe
from hvd_train.training.position import Position

# What a resumed run may change: how batches are read never changes what they hold, nor where
# the records go; how the ranks share the optimizer's state out never changes the update (the
# checkpoints hold it whole).
SAFE_CHANGES = (
    "schedule.epochs",
    "model.metrics",
    "data.workers",
    "data.prefetch",
    "data.timeout",
    "output.trackers",
    "horovod.shard",
)


def saved_framework(output_dir: Path) -> str | None:
    """The framework of the run's newest checkpoint, if this rank can read it: the default of
    --framework when resuming."""
    found = checkpoints(output_dir / "checkpoints")
    try:
        return str(json.loads((found[-1] / "state.json").read_text())["framework"])
    except (IndexError, OSError, ValueError, KeyError, TypeError):
        return None


def resume_point(output_dir: Path, start: str) -> Checkpoint | None:
    """The checkpoint a run resumes from: its newest valid one (`start` "latest"), or the best
    one it kept ("best")."""
    if start == "latest":
        return load_newest_valid(output_dir / "checkpoints")
    best = best_checkpoint(output_dir / BEST)
    if best is None:
        raise UsageError(
            f"nothing to resume from: {output_dir / BEST} holds no checkpoint (the recipe keeps "
            "the best with [checkpoints] keep_best); use --resume latest"
        )
    return load_checkpoint(best)


def read_resume_point(
    dist: Distributed, output_dir: Path, everywhere: bool, start: str
) -> tuple[Checkpoint | None, dict, str]:
    """Rank 0 reads the checkpoint to resume from (`start`: "latest" or "best"); every rank
    gets its state and recipe text, rank 0 also the checkpoint (the others receive the weights
    by broadcast later). With `everywhere` (elastic jobs), each rank reads it itself, with no
    collective."""
    found: list[Checkpoint] = []

    def read() -> tuple[dict[str, Any], str]:
        checkpoint = resume_point(output_dir, start)
        if checkpoint is None:
            raise UsageError(
                f"nothing to resume: {output_dir / 'checkpoints'} holds no valid checkpoint; "
                "leave out --resume to start a new run"
            )
        found.append(checkpoint)
        return checkpoint.state | {"path": str(checkpoint.path)}, checkpoint.recipe_text

    state, recipe_text = read() if everywhere else dist.on_rank_zero(read)
    return (found[0] if found and dist.is_rank_zero else None), state, recipe_text


def saved_recipe(state: dict[str, Any], recipe_text: str, reference: str | None = None) -> Recipe:
    """The recipe a checkpoint was trained with: a neutral recipe from its saved effective
    TOML, unless that names a Python recipe's own function (an optimizer, a decay); a Python
    recipe from its code (at `reference` if given, else where it was), with the saved
    settings."""
    path = Path(state["path"]) / "recipe.toml"
    names_a_function = f'"{PYTHON_FUNCTION}' in recipe_text  # a value that starts with it
    if reference is None and state["layout"] == "neutral" and not names_a_function:
        return parse_toml_recipe(recipe_text, state["recipe"], str(path), path.parent)
    recipe = load_recipe(reference or state["recipe_source"])
    if state["layout"] == "neutral" and reference is not None:
        return recipe
    tables = tomllib.loads(recipe_text)
    saved = {
        f"{section}.{key}": value
        for section in ("data", "optimizer", "schedule", "horovod")
        for key, value in tables.get(section, {}).items()
        if key != "python" and not _function(value)
    }
    return recipe.with_overrides(saved)


def _function(value: Any) -> bool:
    """Whether a saved setting is a Python recipe's own function, recorded by its name."""
    return isinstance(value, str) and value.startswith(PYTHON_FUNCTION)


def _flat(recipe: Recipe) -> dict[str, Any]:
    """Every setting by `section.key` (the description is not one)."""
    table = recipe.settings_table()
    del table["description"]
    return {
        f"{section}.{key}": value
        for section, values in table.items()
        for key, value in values.items()
    }


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else "another value"


def check_same_run(saved: Recipe, given: Recipe, checkpoint: str) -> None:
    """Refuses `given` (the flags' and recipe's settings) if it differs from the checkpoint's
    in anything but the safe changes."""
    before, now = _flat(saved), _flat(given)
    for key in sorted(before.keys() | now.keys()):
        if key not in SAFE_CHANGES and before.get(key) != now.get(key):
            raise UsageError(
                f"--resume: {key} is {_shown(now.get(key))} here but {_shown(before.get(key))} "
                f"in checkpoint {checkpoint}; leave it out to continue the run as it trained, or "
                "start a new run in another --output-dir"
            )


def resumed_option(state: dict[str, Any], flag: str, given: Any) -> Any:
    """The run's own value of a flag that shapes what trains (--seed, --limit-steps); a given
    one must agree with it."""
    saved = state.get(flag.removeprefix("--").replace("-", "_"))
    if given is not None and given != saved:
        raise UsageError(
            f"--resume: {flag} {given} differs from the run's "
            f"{'none' if saved is None else saved} (checkpoint {state['path']}); leave {flag} "
            "out to continue the run with its own"
        )
    return saved


def check_layout(checkpoint: Checkpoint, framework: str, layout: str) -> None:
    """Weights load into a model of their layout: the neutral layout of TOML recipes under
    every framework, a recipe's own model's under each framework that trains that model."""
    state = checkpoint.state
    trains = layout == "neutral" or layout in FRAMEWORKS[framework].models
    if state["layout"] == layout and trains:
        return
    if state["layout"] == "neutral" or layout == "neutral":
        raise UsageError(
            f"checkpoint {checkpoint.path} holds {state['layout']} weights (recipe "
            f"{state['recipe']!r}), and this recipe's model keeps {layout} weights; use the "
            "recipe that wrote it"
        )
    raise UsageError(
        f"checkpoint {checkpoint.path} holds the {state['layout']} weights of Python recipe "
        f"{state['recipe']!r}, written under {state['framework']}; use --framework "
        f"{state['framework']} (only neutral TOML recipes move between frameworks)"
    )


def check_continues(checkpoint: Checkpoint, framework: str, position: Position, epochs: int,
                    output_dir: Path) -> None:  # fmt: skip
    """A run resumes in the framework that wrote its optimizer state, and only to train on."""
    written_by = checkpoint.state["framework"]
    if written_by != framework:  # the optimizer's state is the framework's own
        raise UsageError(
            f"checkpoint {checkpoint.path} was written by {written_by}; "
            f"resume it with --framework {written_by}"
        )
    if position.epoch >= epochs:
        raise UsageError(
            f"the run in {output_dir} already finished {position.epoch} "
            "epochs; raise --epochs to train further"
        )


def optimizer_misfit(checkpoint: Checkpoint, error: Exception) -> UsageError:
    return UsageError(
        f"checkpoint {checkpoint.path}'s optimizer state does not fit this optimizer "
        f"({error}); resume with the recipe that wrote it"
    )
