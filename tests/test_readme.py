"""The README's "Bring your own model" recipe and its own loop work as printed, copied into a
file."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from hvd_train.checkpoint import checkpoint_name, checkpoints
from tests.conftest import REPO


@pytest.mark.torch
def test_the_readmes_own_model_recipe_trains_as_printed(tmp_path):
    readme = (REPO / "README.md").read_text()
    section = readme.split("### Bring your own model", 1)[1]
    recipe = re.search(r"```python\n(.*?)```", section, re.DOTALL).group(1)
    (tmp_path / "my_recipe.py").write_text(recipe)
    command = [sys.executable, "-m", "hvd_train", "--recipe", "my_recipe.py",
               "--output-dir", "runs/mine"]  # fmt: skip
    result = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    summary = json.loads((tmp_path / "runs/mine/summary.json").read_text())
    assert summary["recipe"] == "my_recipe" and summary["epochs"] == 3
    assert summary["test_accuracy"] >= 0.95  # the label is the sign of one feature


def test_the_readme_is_short_and_its_links_lead_somewhere():
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= 400  # a newcomer's five minutes; the rest is in docs/
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", readme)
    local = [link for link in links if "://" not in link]
    assert local and [link for link in local if not (REPO / link).exists()] == []


@pytest.mark.multiprocess
@pytest.mark.torch
def test_the_readmes_own_loop_trains_as_printed(tmp_path, mnist_dir):
    readme = (REPO / "README.md").read_text()
    section = readme.split("## Your own loop", 1)[1]
    loop = re.search(r"```python\n(.*?)```", section, re.DOTALL).group(1)
    (tmp_path / "loop.py").write_text(loop)
    horovodrun = Path(sys.executable).parent / "horovodrun"
    command = [str(horovodrun), "-np", "2", "--gloo", sys.executable, "loop.py"]
    env = os.environ | {"HVD_TRAIN_DATA_DIR": str(mnist_dir)}
    result = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=300,
                            env=env)  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert checkpoints(tmp_path / "runs/mine/checkpoints")[-1].name == checkpoint_name(2, 0)
