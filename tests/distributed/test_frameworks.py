"""The framework registry (`hvd_train/frameworks.py`): nothing outside a framework's backend
and builder, the registry and the two lists that import them (`distributed/backends.py`,
`builders/__init__.py`) names a framework or imports it (Keras's model state, which both
backends read, is Keras's own module), and each registered framework's backend and builder are
what its entry says (checked in a process of its own, as one process loads one Horovod
binding)."""

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

from hvd_train.frameworks import FRAMEWORKS
from tests.conftest import FRAMEWORKS as PARAMETERS
from tests.conftest import REPO

PACKAGE = REPO / "hvd_train"
# Every name of a framework: --framework's, its module's, its display name, and the model
# libraries it trains (Keras), compared as words in any case.
NAMES = {name.lower() for f in FRAMEWORKS.values()
         for name in (f.name, f.module, f.display, *f.models)}  # fmt: skip


def own_files() -> set[Path]:
    """The registry and its two lists, Keras's model state, and each framework's backend
    package and builder."""
    files = {
        PACKAGE / "frameworks.py",
        PACKAGE / "distributed" / "backends.py",
        PACKAGE / "builders" / "__init__.py",
        PACKAGE / "distributed" / "keras_state.py",
    }
    for framework in FRAMEWORKS.values():
        package = PACKAGE / "distributed" / framework.name
        builder = {"torch": "torch_layers", "keras": "keras_models"}[framework.models[0]]
        builder = PACKAGE / "builders" / f"{builder}.py"
        files |= {*package.rglob("*.py"), builder}
    return files


def docstrings(tree: ast.AST) -> set[int]:
    """The ids of the docstrings' nodes."""
    found = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
            found.add(id(body[0].value))
    return found


def names_in(text: str) -> set[str]:
    """The frameworks' names among `text`'s words, a module path's parts included."""
    return {word.lower() for word in re.findall(r"[A-Za-z]\w*", text)} & NAMES


def framework_names(path: Path) -> list[str]:
    """Where `path` names a framework: a string (but a docstring) holding one of its names as a
    word, in a sentence, a module path ("horovod.torch") or an f-string, or an import of its
    module."""
    tree = ast.parse(path.read_text())
    skipped, found = docstrings(tree), []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Constant) and isinstance(node.value, str)
                and id(node) not in skipped and names_in(node.value)):  # fmt: skip
            found.append(f"{path.name}:{node.lineno}: {node.value!r}")
        imported = []
        if isinstance(node, ast.Import):
            imported = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported = [node.module]
        found += [f"{path.name}:{node.lineno}: import {name}"  # type: ignore[attr-defined]
                  for name in imported if name.split(".")[0] in NAMES]  # fmt: skip
    return found


def test_only_the_registry_and_each_frameworks_own_modules_name_it():
    assert all(path.is_file() for path in own_files())
    named = [hit for path in sorted(PACKAGE.rglob("*.py")) if path not in own_files()
             for hit in framework_names(path)]  # fmt: skip
    assert named == []


def test_the_scan_finds_a_framework_named_elsewhere(tmp_path):
    stray = tmp_path / "stray.py"
    stray.write_text(
        '"""Names torch in its docstring."""\nimport torch\n\nif x == "tensorflow":\n'
        "    print(f'under {x}: torch')\n"
        'modules = ("horovod.torch", "PyTorch 2", "a Keras policy")\n'
        'fine = ("torchvision", "storch", "tf32")\n'
    )
    assert sorted(framework_names(stray)) == [
        "stray.py:2: import torch", "stray.py:4: 'tensorflow'", "stray.py:5: ': torch'",
        "stray.py:6: 'PyTorch 2'", "stray.py:6: 'a Keras policy'", "stray.py:6: 'horovod.torch'",
    ]  # fmt: skip


@pytest.mark.parametrize("framework", PARAMETERS)
def test_each_entry_names_its_backend_and_builder(framework):
    entry = FRAMEWORKS[framework]
    package = f"hvd_train.distributed.{framework}"
    probe = (
        "from hvd_train.builders import framework_builder\n"
        "from hvd_train.distributed.backends import create_backend\n"
        f"backend = create_backend({framework!r})\n"
        f"assert type(backend).__module__ == {package + '.backend'!r}\n"
        f"assert backend.name == {framework!r} and backend.hvd.__name__ == {entry.binding!r}\n"
        "from hvd_train.recipe.settings import LOSSES\n"
        "assert set(backend.losses) == set(LOSSES)  # every loss a recipe may name\n"
        f"builder = framework_builder({framework!r})\n"
        "assert all(callable(getattr(builder, f))\n"
        "           for f in ('build_neutral', 'seed', 'own_model'))\n"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                            timeout=300, check=False)  # fmt: skip
    assert result.returncode == 0, result.stderr


def test_the_backend_surface_is_the_documented_one() -> None:
    """What a new framework must write is `Backend`'s abstract methods, each named on the
    "Adding a framework" page; a method added to them is added there too."""
    from hvd_train.distributed.backend import Backend

    page = (REPO / "docs" / "adding-a-framework.md").read_text()
    abstract = sorted(Backend.__abstractmethods__)
    assert abstract == sorted(["start", "setup", "step", "eval_batch", "broadcast_state",
                               "sync_buffers", "state", "load_state", "tensors", "reseed",
                               "layout", "overlapping", "scale_learning_rate"])  # fmt: skip
    assert [name for name in abstract if f"`{name}`" not in page] == []
