"""The package's modules import each other without a cycle, so each can be read (and imported)
after what it builds on. An import counts wherever it is written, inside a function too (a
deferred import still ties the two modules), except under `if TYPE_CHECKING:`; importing a
module imports its packages' `__init__` too (the root package's aside, which every module
imports). The floors' contract (`make lint`, pyproject.toml's [tool.importlinter]) breaks on an
import that reaches up, and sees every import."""

import ast
import graphlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(tree: ast.AST, package: str) -> set[str]:
    """The names `tree` imports from `package`, outside `if TYPE_CHECKING:` blocks."""
    skipped = {id(node) for block in ast.walk(tree)
               if isinstance(block, ast.If) and getattr(block.test, "id", "") == "TYPE_CHECKING"
               for node in ast.walk(block)}  # fmt: skip
    names = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(package):
            names |= {node.module, *(f"{node.module}.{alias.name}" for alias in node.names)}
        elif isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names if alias.name.startswith(package)}
    return names


def import_graph(root: Path, package: str) -> dict[str, set[str]]:
    """Each module of `package` (under `root`) and the modules it imports."""
    paths = {module_name(path, root): path for path in (root / package).rglob("*.py")}
    graph = {}
    for module, path in paths.items():
        depends = set()
        for name in imported(ast.parse(path.read_text()), package):
            while name not in paths:  # `from package.module import function`
                name = name.rpartition(".")[0]
            parts = name.split(".")
            for count in range(2, len(parts) + 1):  # the module and the packages above it
                above = ".".join(parts[:count])
                if above != module and not module.startswith(f"{above}."):
                    depends.add(above)
        graph[module] = depends
    return graph


def cycle(graph: dict[str, set[str]]) -> list[str]:
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as error:
        return list(error.args[1])
    return []


def test_the_package_imports_without_a_cycle():
    assert cycle(import_graph(REPO, "hvd_train")) == []


def test_a_cycle_through_a_deferred_import_or_a_package_is_found(tmp_path):
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("from pkg.sub.inner import value\n")
    (package / "sub" / "inner.py").write_text("value = 1\n")
    (package / "user.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import pkg.other\n"
        "def f():\n    from pkg.sub.inner import value\n"
    )  # fmt: skip
    (package / "other.py").write_text("import pkg.user\n")
    graph = import_graph(tmp_path, "pkg")
    assert graph["pkg.user"] == {"pkg.sub", "pkg.sub.inner"} and cycle(graph) == []
    (package / "sub" / "inner.py").write_text("from pkg.user import f\n")
    assert set(cycle(import_graph(tmp_path, "pkg"))) == {"pkg.sub.inner", "pkg.user"}


def dynamic_imports(path: Path) -> list[str]:
    """Where `path` imports a module by a name it computes (`importlib.import_module`,
    `__import__`), which no import graph can follow."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call):
            name = getattr(node.func, "attr", getattr(node.func, "id", ""))
            if name in ("import_module", "__import__"):
                found.append(f"{path.relative_to(REPO)}:{node.lineno}")
    return found


def test_the_package_imports_none_of_its_modules_by_a_computed_name():
    """Each import of the package's own modules is written out, so the floors' contract
    (`make lint`) sees it; what is imported by name is a user's recipe module and the chosen
    framework's own module."""
    found = [hit for path in sorted((REPO / "hvd_train").rglob("*.py"))
             for hit in dynamic_imports(path)]  # fmt: skip
    assert [hit.split(":")[0] for hit in found] == [
        "hvd_train/frameworks.py",
        "hvd_train/recipe/python.py",
    ]


def lint_imports(package: Path) -> subprocess.CompletedProcess[str]:
    """lint-imports with the project's contracts, on the copy of the package in `package`."""
    return subprocess.run(
        [str(Path(sys.executable).with_name("lint-imports")), "--config",
         str(REPO / "pyproject.toml")],
        cwd=package, capture_output=True, text=True, timeout=120, check=False,
        env=os.environ | {"PYTHONPATH": str(package)},
    )  # fmt: skip


@pytest.mark.parametrize(
    ("module", "reach_up"),
    [
        ("recipe/base.py", "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                           "    from hvd_train.distributed import Distributed\n"),
        ("data/base.py", "def later():\n    from hvd_train.recipe import Recipe\n"),
        ("training/trainer.py", "from hvd_train.distributed.exchange import Exchange\n"),
        ("training/run.py", "from hvd_train.data.order import rank_steps\n"),
    ],
)  # fmt: skip
def test_the_floors_contract_breaks_on_an_import_that_reaches_past_it(tmp_path, module, reach_up):
    shutil.copytree(REPO / "hvd_train", tmp_path / "hvd_train")
    assert lint_imports(tmp_path).returncode == 0
    with (tmp_path / "hvd_train" / module).open("a") as out:
        out.write(reach_up)
    result = lint_imports(tmp_path)
    assert result.returncode != 0 and "BROKEN" in result.stdout.upper(), result.stdout
