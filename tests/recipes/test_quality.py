"""The quality bar: the packaged recipes under `horovodrun -np 2` reach their accuracy on real
MNIST: mnist_cnn 99% (with its gradients sent as fp32 and as bf16), mnist_bn 99.3%."""

import functools
import json
from collections.abc import Callable

import pytest

from tests.conftest import FRAMEWORKS
from tests.horovodrun import trainings

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow, pytest.mark.timeout(1200)]
RUNS = {  # name: recipe and settings
    "mnist_bn": ["--recipe", "mnist_bn"],
    "mnist_cnn": ["--recipe", "mnist_cnn"],
    "mnist_cnn-bf16": ["--recipe", "mnist_cnn", "--set", "horovod.compression=bf16"],
}


@pytest.fixture(scope="module")
def summaries(mnist_dir, tmp_path_factory) -> Callable[[str], dict[str, dict]]:
    """Every run of RUNS under a framework, trained in one job once: their summaries by name."""

    @functools.cache
    def trained(framework: str) -> dict[str, dict]:
        out = tmp_path_factory.mktemp(f"quality-{framework}")
        common = ["--framework", framework, "--data-dir", str(mnist_dir)]
        trainings(*[[*arguments, *common, "--output-dir", str(out / name)]
                    for name, arguments in RUNS.items()])  # fmt: skip
        found = {name: json.loads((out / name / "summary.json").read_text()) for name in RUNS}
        print(f"under {framework}: {found}")
        assert {summary["world_size"] for summary in found.values()} == {2}
        return found

    return trained


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_mnist_bn_reaches_its_accuracy(framework, summaries):
    summary = summaries(framework)["mnist_bn"]
    assert summary["epochs"] == 3 and summary["test_accuracy"] >= 0.993


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_mnist_cnn_reaches_its_accuracy_with_gradients_sent_as_fp32_and_as_bf16(
    framework, summaries
):
    """bf16 keeps 8 bits of each gradient: the same training within 0.3 points."""
    fp32, bf16 = summaries(framework)["mnist_cnn"], summaries(framework)["mnist_cnn-bf16"]
    assert fp32["epochs"] == bf16["epochs"] == 2
    assert fp32["test_accuracy"] >= 0.99 and bf16["test_accuracy"] >= 0.99
    assert abs(bf16["test_accuracy"] - fp32["test_accuracy"]) <= 0.003
