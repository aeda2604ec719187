"""The quality bar: the packaged recipes under `horovodrun -np 2` reach their accuracy on real
MNIST: mnist_bn 99.3%, mnist_cnn 99% (under torch that is the README's `make train`, which
tests/test_readme.py checks; gradients sent as bf16 are tests/distributed/test_precision.py's)."""

import functools
import json
from collections.abc import Callable

import pytest

from tests.conftest import FRAMEWORKS
from tests.horovodrun import trainings

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow, pytest.mark.timeout(1200)]
RUNS = {  # name: recipe and settings, and the frameworks it runs under here
    "mnist_bn": (["--recipe", "mnist_bn"], ("torch", "tensorflow")),
    "mnist_cnn": (["--recipe", "mnist_cnn"], ("tensorflow",)),
}


@pytest.fixture(scope="module")
def summaries(mnist_dir, tmp_path_factory) -> Callable[[str], dict[str, dict]]:
    """Every run of RUNS under a framework, trained in one job once: their summaries by name."""

    @functools.cache
    def trained(framework: str) -> dict[str, dict]:
        out = tmp_path_factory.mktemp(f"quality-{framework}")
        common = ["--framework", framework, "--data-dir", str(mnist_dir)]
        names = [name for name, (_, frameworks) in RUNS.items() if framework in frameworks]
        trainings(*[[*RUNS[name][0], *common, "--output-dir", str(out / name)]
                    for name in names])  # fmt: skip
        found = {name: json.loads((out / name / "summary.json").read_text()) for name in names}
        print(f"under {framework}: {found}")
        assert {summary["world_size"] for summary in found.values()} == {2}
        return found

    return trained


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_mnist_bn_reaches_its_accuracy(framework, summaries):
    summary = summaries(framework)["mnist_bn"]
    assert summary["epochs"] == 3 and summary["test_accuracy"] >= 0.993


@pytest.mark.tensorflow
def test_mnist_cnn_reaches_its_accuracy_under_tensorflow(summaries):
    summary = summaries("tensorflow")["mnist_cnn"]
    assert summary["epochs"] == 2 and summary["test_accuracy"] >= 0.99
