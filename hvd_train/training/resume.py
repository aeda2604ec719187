"""What a resumed run takes from its checkpoint, and every check that the checkpoint fits: the
recipe as it trained (overrides included), the seed, and by default the framework. The user
types only `--resume --output-dir`; a flag that contradicts the checkpoint is refused, naming
the difference, except the safe changes: more epochs, another world size, how the ranks share
the optimizer's state out, and how the run is watched (logging, checkpoint frequency). `eval`
checks its checkpoint here too.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from hvd_train.distributed import Found
from hvd_train.errors import UsageError
from hvd_train.frameworks import FRAMEWORKS
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


def saved_recipe(found: Found, reference: str | None = None) -> Recipe:
    """The recipe a checkpoint was trained with: a neutral recipe from its saved effective
    TOML, unless that names a Python recipe's own function (an optimizer, a decay); a Python
    recipe from its code (at `reference` if given, else where it was), with the saved
    settings."""
    state, recipe_text = found.state, found.recipe_text
    path = found.path / "recipe.toml"
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


def resumed_option(found: Found, flag: str, given: Any) -> Any:
    """The run's own value of a flag that shapes what trains (--seed, --limit-steps); a given
    one must agree with it."""
    saved = found.values.get(flag.removeprefix("--").replace("-", "_"))
    if given is not None and given != saved:
        raise UsageError(
            f"--resume: {flag} {given} differs from the run's "
            f"{'none' if saved is None else saved} (checkpoint {found.path}); leave {flag} "
            "out to continue the run with its own"
        )
    return saved


def check_layout(checkpoint: Found, framework: str, layout: str) -> None:
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
            "recipe that wrote it",
            every_rank=True,
        )
    raise UsageError(
        f"checkpoint {checkpoint.path} holds the {state['layout']} weights of Python recipe "
        f"{state['recipe']!r}, written under {state['framework']}; use --framework "
        f"{state['framework']} (only neutral TOML recipes move between frameworks)",
        every_rank=True,
    )


def check_continues(checkpoint: Found, framework: str, position: Position, epochs: int,
                    output_dir: Path) -> None:  # fmt: skip
    """A run resumes in the framework that wrote its optimizer state, and only to train on."""
    written_by = checkpoint.state["framework"]
    if written_by != framework:  # the optimizer's state is the framework's own
        raise UsageError(
            f"checkpoint {checkpoint.path} was written by {written_by}; "
            f"resume it with --framework {written_by}",
            every_rank=True,
        )
    if position.epoch >= epochs:
        raise UsageError(
            f"the run in {output_dir} already finished {position.epoch} "
            "epochs; raise --epochs to train further",
            every_rank=True,
        )
