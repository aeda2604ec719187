"""The quality bar: the recipe's defaults under `horovodrun -np 2` reach 99% on real MNIST."""

import json

import pytest

from tests.conftest import FRAMEWORKS
from tests.multiprocess.conftest import horovodrun, script

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow, pytest.mark.timeout(1200)]


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_recipe_defaults_reach_99_percent(framework, mnist_dir, tmp_path):
    horovodrun(
        script("cli_per_rank.py"),
        str(tmp_path),
        "--framework",
        framework,
        "--data-dir",
        str(mnist_dir),
    )
    summary = json.loads((tmp_path / "rank0" / "summary.json").read_text())
    print(f"{framework}: {summary}")
    assert summary["epochs"] == 4 and summary["world_size"] == 2
    assert summary["test_accuracy"] >= 0.99
