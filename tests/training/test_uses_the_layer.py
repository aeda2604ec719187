"""The trainer is a loop written on the public distributed layer, as a loop of one's own is:
nothing in the training loop (nor anywhere outside `distributed/`) imports more of
`hvd_train.distributed` than the layer and the registry of frameworks' names."""

import ast
from pathlib import Path

from tests.conftest import REPO

PACKAGE = REPO / "hvd_train"
LAYER, REGISTRY = "hvd_train.distributed.layer", "hvd_train.distributed.frameworks"


def distributed_imports(path: Path) -> set[str]:
    """The modules of `hvd_train.distributed` that `path` imports, wherever it imports them."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [f"{node.module}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            continue
        found |= {name for name in names if name.startswith("hvd_train.distributed")}
    return found


def imports_beyond(paths: list[Path], allowed: set[str]) -> list[str]:
    return [f"{path.name}: {name}" for path in paths
            for name in sorted(distributed_imports(path))
            if not any(name.startswith(f"{a}.") for a in allowed)]  # fmt: skip


def test_the_training_loop_drives_the_framework_through_the_layer_alone():
    loop = sorted((PACKAGE / "training").rglob("*.py"))
    assert imports_beyond(loop, {LAYER, REGISTRY}) == []
    assert f"{LAYER}.Distributed" in distributed_imports(PACKAGE / "training" / "run.py")


def test_the_rest_of_the_package_sees_the_layer_and_the_registry_only():
    outside = [path for path in sorted(PACKAGE.rglob("*.py"))
               if "distributed" not in path.relative_to(PACKAGE).parts]  # fmt: skip
    assert imports_beyond(outside, {LAYER, REGISTRY}) == []


def test_the_scan_sees_an_import_of_a_backend(tmp_path):
    stray = tmp_path / "stray.py"
    stray.write_text("def f():\n    from hvd_train.distributed.torch.exchange import Exchange\n")
    assert imports_beyond([stray], {LAYER}) != []
    stray.write_text("from hvd_train.distributed.layer import Distributed\n")
    assert imports_beyond([stray], {LAYER}) == []
