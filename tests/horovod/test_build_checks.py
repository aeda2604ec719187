"""The patched build checks (patch 12) answer from the extension's library: horovodrun learns
that Gloo is built without importing a framework."""

import os
import subprocess
import sys
from pathlib import Path

CHECKS = (
    "from horovod.common import util\nprint(util.gloo_built(), util.extension_available('torch'))"
)


def test_gloo_is_found_built_where_no_framework_can_be_imported(tmp_path: Path):
    # torch and tensorflow shadowed by packages that refuse to import: the checks that import
    # a binding find nothing, the library's own answer is still there.
    for framework in ("torch", "tensorflow"):
        (tmp_path / framework).mkdir()
        (tmp_path / framework / "__init__.py").write_text("raise ImportError('shadowed')\n")
    environment = os.environ | {"PYTHONPATH": str(tmp_path)}
    result = subprocess.run([sys.executable, "-c", CHECKS], capture_output=True, text=True,
                            timeout=120, env=environment)  # fmt: skip
    assert result.stdout.split() == ["True", "False"], result.stdout + result.stderr
