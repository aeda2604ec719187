"""Python recipes: a module that makes a `hvd_train.Recipe`, by file (`path/recipe.py`, or
`path/recipe.py:NAME`) or by module (`package.module:NAME`). NAME defaults to `recipe`.

The module is imported in every rank. Import the framework inside the model function rather
than at the top where you can: then a torch run never loads TensorFlow. Keras may be imported at
the top: hvd_train sets KERAS_BACKEND for the chosen framework before the recipe loads.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

from hvd_train.errors import UsageError
from hvd_train.recipe.base import Recipe
from hvd_train.recipe.toml import with_data_path_from


def is_python_reference(reference: str) -> bool:
    """Whether `reference` names Python code: a .py file or package.module[:NAME]."""
    file = reference.partition(":")[0] if ".py:" in reference else reference
    if file.endswith(".py"):
        return True
    return (
        not reference.endswith(".toml")
        and "/" not in reference
        and (":" in reference or "." in reference)
    )


def _import_file(path: Path) -> ModuleType:
    try:
        source = path.read_bytes()
    except OSError as error:
        raise UsageError(
            f"cannot read recipe {path}: {error.strerror or error}; check the --recipe path"
        ) from None
    try:
        if b"\0" in source:
            raise ValueError("it holds NUL bytes")
        source.decode()
    except ValueError as error:
        raise UsageError(
            f"{path} is not Python source ({error}); check the --recipe path"
        ) from None
    name = f"hvd_train_recipe_{hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:8]}"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # so that the objects it defines can be pickled by reference
    # Its folder is importable while it loads, so a recipe may import its neighbours.
    sys.path.insert(0, str(path.parent))
    try:
        spec.loader.exec_module(module)
    except UsageError as error:  # a mistake in the recipe's settings
        raise UsageError(f"{path}: {error}") from None
    finally:
        sys.path.remove(str(path.parent))
    return module


def _import_module(name: str) -> ModuleType:
    try:
        return importlib.import_module(name)
    except UsageError as error:  # a mistake in the recipe's settings
        raise UsageError(f"{name}: {error}") from None
    except ModuleNotFoundError as error:
        if error.name is None or not name.startswith(error.name):
            raise  # the recipe itself imports something missing: its own traceback says what
        raise UsageError(
            f"cannot import recipe module {name!r} ({error}); check the --recipe reference and "
            "that the package is installed or on PYTHONPATH"
        ) from None


def load_python_recipe(reference: str) -> Recipe:
    """Imports the recipe's module and returns its recipe, named and with its code's hash.
    A mistake in the recipe's settings is one line naming the file; an exception in its own
    code keeps its traceback."""
    target, _, attribute = reference.rpartition(":") if ":" in reference else (reference, "", "")
    attribute = attribute or "recipe"
    is_file = target.endswith(".py")
    source = str(Path(target).resolve()) if is_file else target
    try:
        module = _import_file(Path(target)) if is_file else _import_module(target)
    except SyntaxError as error:
        raise UsageError(
            f"{error.filename}:{error.lineno}: {error.msg}; fix the recipe's syntax"
        ) from None
    recipe = getattr(module, attribute, None)
    if not isinstance(recipe, Recipe):
        found = "nothing" if recipe is None else f"a {type(recipe).__name__}"
        raise UsageError(
            f"{target}: {attribute} is {found}, not a hvd_train.Recipe; define "
            f"{attribute} = hvd_train.Recipe(...) there, or name another with {target}:NAME"
        )
    code = Path(module.__file__).read_bytes() if module.__file__ else reference.encode()
    named = dataclasses.replace(
        recipe,
        name=Path(target).stem if is_file else attribute,
        source=f"{source}:{attribute}",
        code_hash=hashlib.sha256(code).hexdigest()[:16],
    )
    base = Path(module.__file__).parent if module.__file__ else Path.cwd()
    return with_data_path_from(named, base)
