"""The package's modules import each other without a cycle, so each can be read (and imported)
after what it builds on. An import counts wherever it is written, inside a function too (a
deferred import still ties the two modules), except under `if TYPE_CHECKING:`; importing a
module imports its packages' `__init__` too (the root package's aside, which every module
imports)."""

import ast
import graphlib
from pathlib import Path

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
