"""The quality bar: the packaged recipes under `horovodrun -np 2` reach their accuracy on real
MNIST: mnist_cnn 99%, mnist_bn 99.3%."""

import json

import pytest

from tests.conftest import FRAMEWORKS
from tests.multiprocess.conftest import horovodrun, script

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow, pytest.mark.timeout(1200)]


@pytest.mark.parametrize("framework", FRAMEWORKS)
@pytest.mark.parametrize(("recipe", "epochs", "accuracy"), [("mnist_cnn", 2, 0.99),
                                                           ("mnist_bn", 3, 0.993)])  # fmt: skip
def test_packaged_recipes_reach_their_accuracy(recipe, epochs, accuracy, framework, mnist_dir,
                                               tmp_path):  # fmt: skip
    horovodrun(script("cli_per_rank.py"), str(tmp_path), "--recipe", recipe,
               "--framework", framework, "--data-dir", str(mnist_dir))  # fmt: skip
    summary = json.loads((tmp_path / "rank0" / "summary.json").read_text())
    print(f"{recipe} under {framework}: {summary}")
    assert summary["epochs"] == epochs and summary["world_size"] == 2
    assert summary["test_accuracy"] >= accuracy
