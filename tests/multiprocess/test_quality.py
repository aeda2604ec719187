"""The quality bar: the packaged recipes under `horovodrun -np 2` reach their accuracy on real
MNIST: mnist_cnn 99% (with its gradients sent as fp32 and as bf16), mnist_bn 99.3%."""

import json

import pytest

from tests.conftest import FRAMEWORKS
from tests.multiprocess.conftest import horovodrun, script

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow, pytest.mark.timeout(1200)]


def trained(recipe: str, framework: str, mnist_dir, out, *options: str) -> dict:
    """The summary of `recipe` trained under `horovodrun -np 2`."""
    horovodrun(script("cli_per_rank.py"), str(out), "--recipe", recipe,
               "--framework", framework, "--data-dir", str(mnist_dir), *options)  # fmt: skip
    summary = json.loads((out / "rank0" / "summary.json").read_text())
    print(f"{recipe} under {framework} {' '.join(options)}: {summary}")
    assert summary["world_size"] == 2
    return summary


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_mnist_bn_reaches_its_accuracy(framework, mnist_dir, tmp_path):
    summary = trained("mnist_bn", framework, mnist_dir, tmp_path)
    assert summary["epochs"] == 3 and summary["test_accuracy"] >= 0.993


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_mnist_cnn_reaches_its_accuracy_with_gradients_sent_as_fp32_and_as_bf16(
    framework, mnist_dir, tmp_path
):
    """bf16 keeps 8 bits of each gradient: the same training within 0.3 points."""
    fp32 = trained("mnist_cnn", framework, mnist_dir, tmp_path / "fp32")
    bf16 = trained("mnist_cnn", framework, mnist_dir, tmp_path / "bf16",
                   "--set", "horovod.compression=bf16")  # fmt: skip
    assert fp32["epochs"] == bf16["epochs"] == 2
    assert fp32["test_accuracy"] >= 0.99 and bf16["test_accuracy"] >= 0.99
    assert abs(bf16["test_accuracy"] - fp32["test_accuracy"]) <= 0.003
