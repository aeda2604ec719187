"""Mixed precision under the real `horovodrun -np 2`: bf16-mixed, and gradients sent as bf16,
keep mnist_cnn's accuracy, fp16-mixed trains through its loss scaling (a step whose gradients
overflow is skipped, not a fault), and checkpoints keep fp32 weights either way."""

import json
from pathlib import Path

import pytest

from tests.conftest import FRAMEWORKS
from tests.helpers import saved_weights
from tests.horovodrun import trainings

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow, pytest.mark.timeout(1200)]

# mnist_cnn's layers on synthetic data, which it learns to nearly 100% in a few hundred steps.
SYNTHETIC = """
[data]
dataset = "synthetic"
input_shape = [28, 28, 1]
num_classes = 10
train_samples = 4096
test_samples = 1024

[model]
layers = [
  { type = "conv2d", filters = 32, kernel_size = 5 }, { type = "relu" },
  { type = "maxpool2d", pool_size = 2 }, { type = "flatten" },
  { type = "dense", units = 10 }, { type = "softmax" },
]
"""


def trained(*runs: tuple[Path, list[str]]) -> list[dict]:
    """Each (OUTPUT, ARGUMENTS) trained in turn in one job: their summaries, their checkpoints'
    weights checked to be fp32."""
    trainings(*[["--output-dir", str(output), *arguments] for output, arguments in runs])
    for output, _ in runs:
        weights = saved_weights(output, 1)
        assert {str(array.dtype) for array in weights.values()} == {"float32"}
    return [json.loads((output / "summary.json").read_text()) for output, _ in runs]


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_bf16_mixed_and_bf16_exchanges_keep_mnist_cnn_within_a_third_of_a_point_of_fp32(
    framework, mnist_dir, tmp_path
):
    # 200 of the epoch's 469 steps: a CPU without AVX512-BF16 (CI's may lack it) computes bf16
    # several times slower than fp32, and the whole epoch took up to five minutes there.
    arguments = ["--framework", framework, "--epochs", "1", "--limit-steps", "200",
                 "--data-dir", str(mnist_dir)]  # fmt: skip
    settings = {"fp32": "precision=fp32", "bf16-mixed": "precision=bf16-mixed",
                "bf16-exchange": "horovod.compression=bf16"}  # fmt: skip
    summaries = trained(*[(tmp_path / name, [*arguments, "--set", setting])
                          for name, setting in settings.items()])  # fmt: skip
    accuracy = dict(zip(settings, (s["test_accuracy"] for s in summaries), strict=True))
    print(f"mnist_cnn, 200 steps at np=2 under {framework}: {accuracy}")
    assert accuracy["fp32"] >= 0.97
    assert abs(accuracy["bf16-mixed"] - accuracy["fp32"]) <= 0.003
    # Gradients sent as bf16 keep 8 bits of each: the same training within 0.3 points.
    assert abs(accuracy["bf16-exchange"] - accuracy["fp32"]) <= 0.003


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_fp16_mixed_trains_through_its_loss_scaling(framework, tmp_path):
    (tmp_path / "synthetic.toml").write_text(SYNTHETIC)
    [summary] = trained((tmp_path / "run", ["--recipe", str(tmp_path / "synthetic.toml"),
                        "--framework", framework, "--epochs", "1",
                        "--set", "precision=fp16-mixed"]))  # fmt: skip
    # Loss scaling starts at 2^15-2^16: the first steps' gradients overflow fp16, and are skipped.
    assert summary["test_accuracy"] >= 0.95, summary
