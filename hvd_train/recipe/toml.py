"""Framework-neutral recipes in TOML: `[data]` and `[model]` are required, every other table
and key has a default (see docs/recipes.md). Unknown tables and keys are errors, so a
typo cannot be silently ignored."""

from __future__ import annotations

import dataclasses
import tomllib
from importlib import resources
from pathlib import Path
from typing import Any

import tomli_w

from hvd_train.errors import UsageError
from hvd_train.recipe.base import Recipe
from hvd_train.recipe.settings import (
    LOADING_KEYS,
    LOSSES,
    Checkpoints,
    Data,
    ExchangeSettings,
    Loading,
    Optimizer,
    Output,
    Schedule,
    make_settings,
)

TABLES = ("data", "model", "optimizer", "schedule", "horovod", "checkpoints", "output")


def packaged_recipes() -> list[str]:
    """The recipes that come with hvd_train, by name: TOML files, and Python modules (models
    the layer list cannot say, like a residual network)."""
    return sorted(
        Path(entry.name).stem
        for entry in resources.files("hvd_train.recipes").iterdir()
        if entry.name.endswith((".toml", ".py")) and not entry.name.startswith("_")
    )


def _table(root: dict[str, Any], key: str, required: bool = False) -> dict[str, Any]:
    if key not in root:
        if required:
            raise UsageError(f"{key}: missing table; add [{key}] to the recipe")
        return {}
    if not isinstance(root[key], dict):
        raise UsageError(f"{key}: expected a table; see recipes/mnist_cnn.toml")
    return dict(root[key])


def _recipe(root: dict[str, Any]) -> Recipe:
    unknown = sorted(set(root) - {*TABLES, "description"})
    if unknown:
        raise UsageError(
            f"{unknown[0]}: unknown table or key; check its spelling against the recipe "
            "reference (docs/recipes.md)"
        )
    model = _table(root, "model", required=True)
    extra = sorted(set(model) - {"layers", "loss", "metrics"})
    if extra:
        raise UsageError(
            f"model.{extra[0]}: unknown key; check its spelling "
            "against the recipe reference (docs/recipes.md)"
        )
    if "layers" not in model:
        raise UsageError("model.layers: missing; add the list of layers to the recipe")
    loss = model.get("loss", "cross_entropy")
    if loss not in LOSSES:
        raise UsageError(f"model.loss: unknown value {loss!r}; choose one of {', '.join(LOSSES)}")
    description = root.get("description", "")
    if not isinstance(description, str):
        raise UsageError(f"description: expected str, got {description!r}")
    data = _table(root, "data", required=True)
    return Recipe(
        data=make_settings(Data, {k: v for k, v in data.items() if k not in LOADING_KEYS}),
        loading=make_settings(Loading, {k: v for k, v in data.items() if k in LOADING_KEYS}),
        layers=model["layers"],
        loss=loss,
        metrics=model.get("metrics"),
        optimizer=make_settings(Optimizer, _table(root, "optimizer")),
        schedule=make_settings(Schedule, _table(root, "schedule")),
        horovod=make_settings(ExchangeSettings, _table(root, "horovod")),
        checkpoints=make_settings(Checkpoints, _table(root, "checkpoints")),
        output=make_settings(Output, _table(root, "output")),
        description=description,
    )


def parse_toml_recipe(text: str, name: str, source: str, base_dir: Path) -> Recipe:
    """Checks recipe TOML `text` read from `source`; a relative data path is taken from
    `base_dir`. Every problem is one UsageError naming the file, the key and the fix."""
    try:
        recipe = _recipe(tomllib.loads(text))
    except tomllib.TOMLDecodeError as error:
        raise UsageError(f"{source}: not valid TOML ({error}); fix the syntax") from None
    except UsageError as error:
        raise UsageError(f"{source}: {error}") from None
    return with_data_path_from(dataclasses.replace(recipe, name=name, source=source), base_dir)


def with_data_path_from(recipe: Recipe, base_dir: Path) -> Recipe:
    """`recipe` with its data path made absolute, as seen from the recipe's folder."""
    data = recipe.data
    if not isinstance(data, Data) or data.path is None:
        return recipe
    path = str((base_dir / Path(data.path).expanduser()).resolve())
    return dataclasses.replace(recipe, data=dataclasses.replace(data, path=path))


def load_toml_recipe(reference: str) -> Recipe:
    """A packaged recipe by name (`mnist_cnn`) or a recipe file by path (`my.toml`)."""
    if reference.endswith(".toml") or "/" in reference:
        path = Path(reference)
        try:
            text = path.read_text()
        except (OSError, UnicodeDecodeError) as error:
            reason = getattr(error, "strerror", None) or str(error)
            raise UsageError(
                f"cannot read recipe {path}: {reason}; check the --recipe path"
            ) from None
        return parse_toml_recipe(text, path.stem, str(path), path.parent)
    entry = resources.files("hvd_train.recipes") / f"{reference}.toml"
    if not entry.is_file():
        known = ", ".join(packaged_recipes())
        raise UsageError(
            f"unknown recipe {reference!r}; use one of {known}, a path to a .toml or .py file, "
            "or package.module:NAME"
        )
    with resources.as_file(entry) as path:
        return parse_toml_recipe(
            path.read_text(), reference, f"recipes/{reference}.toml", path.parent
        )


def recipe_toml(recipe: Recipe) -> str:
    """The effective recipe as TOML, with its hash."""
    header = (
        f"# recipe {recipe.name} ({recipe.source or 'made in code'}), hash {recipe.recipe_hash()}\n"
    )
    return header + tomli_w.dumps(recipe.settings_table())
