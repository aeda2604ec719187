"""The package as `pip install .` installs it (the container images do): every module of the
source tree, and the packaged recipes, are in the wheel."""

import shutil
import subprocess
import sys
import zipfile

from tests.conftest import REPO


def test_the_wheel_holds_every_module_and_the_packaged_recipes(tmp_path):
    source = tmp_path / "source"  # a clean copy: a build/ left in the clone would hide a gap
    for name in ("hvd_train", "recipes"):
        shutil.copytree(REPO / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    command = [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
               "--no-build-isolation", "--wheel-dir", str(tmp_path), str(source)]  # fmt: skip
    subprocess.run(command, check=True, capture_output=True, timeout=300)
    (wheel,) = tmp_path.glob("hvd_train-*.whl")
    held = set(zipfile.ZipFile(wheel).namelist())
    modules = {str(p.relative_to(REPO)) for p in (REPO / "hvd_train").rglob("*.py")}
    assert modules - held == set()
    packaged = [*(REPO / "recipes").glob("*.toml"), REPO / "recipes" / "resnet18.py"]
    recipes = {f"hvd_train/recipes/{p.name}" for p in packaged}
    assert recipes and recipes - held == set()
