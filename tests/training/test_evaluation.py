"""evaluation.py through the CLI, alone: labels of any dtype and shape reach the loss as given,
a user metric is reported by name, and a model whose outputs do not fit the labels (or a metric
that returns the wrong thing) is one line before any training."""

import json
import textwrap
from pathlib import Path

import pytest

from tests.conftest import FRAMEWORKS
from tests.helpers import hvd_train
from tests.test_cli import assert_usage_error

# Each test trains in a process of its own: make test runs them, test-quick not.
pytestmark = pytest.mark.slow

RECIPE = """
import keras
import numpy as np
from hvd_train import Recipe, Schedule

def data():
    generator = np.random.default_rng(0)
    x = generator.normal(size=(203, 6)).astype(np.float32)
    {labels}
    def part(s):
        return tuple(a[s] for a in y) if isinstance(y, tuple) else y[s]
    return (x[:150], part(slice(150))), (x[150:], part(slice(150, None)))

def model():
    inputs = keras.Input((6,))
    return keras.Model(inputs, keras.layers.Dense({outputs})(inputs))

{extra}

recipe = Recipe(data=data, keras_model=model, schedule=Schedule(epochs=1, batch_size=16),
                {arguments})
"""


def write_recipe(tmp_path: Path, labels: str, outputs: str, arguments: str = "",
                 extra: str = "") -> str:  # fmt: skip
    path = tmp_path / "task.py"
    path.write_text(RECIPE.format(labels=labels, outputs=outputs, arguments=arguments,
                                  extra=textwrap.dedent(extra)))  # fmt: skip
    return str(path)


TWO_TARGETS = """
def loss(outputs, labels):
    # Two targets arrive as a tuple of the framework's tensors: classes and a float.
    classes, value = labels
    assert "int64" in str(classes.dtype) and "float32" in str(value.dtype)
    first = keras.ops.mean(keras.losses.sparse_categorical_crossentropy(
        classes, outputs[:, :3], from_logits=True))
    return first + keras.ops.mean((outputs[:, 3] - value) ** 2)

def class_accuracy(outputs, labels):
    return (outputs[:, :3].argmax(-1) == labels[0]).sum(), len(labels[0])
"""


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_several_targets_reach_the_loss_as_a_tuple_and_a_metric_by_name(framework, tmp_path):
    labels = "y = (np.arange(203) % 3, x[:, 0] * 2)"
    recipe = write_recipe(tmp_path, labels, "4", "loss=loss, metrics=(class_accuracy,)",
                          TWO_TARGETS)  # fmt: skip
    result = hvd_train(
        "--recipe", recipe, "--framework", framework, "--output-dir", str(tmp_path / "r")
    )
    assert result.returncode == 0, result.stderr
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert set(summary) >= {"test_loss", "test_class_accuracy"}, summary
    assert "test_accuracy" not in summary and 0 <= summary["test_class_accuracy"] <= 1
    assert "test class accuracy" in result.stdout


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_class_scores_of_the_wrong_shape_are_one_line(framework, tmp_path):
    recipe = write_recipe(tmp_path, "y = np.zeros((203, 5), np.int64)", "3")
    result = hvd_train(
        "--recipe", recipe, "--framework", framework, "--output-dir", str(tmp_path / "r")
    )
    assert_usage_error(result, "the model gives outputs (N, 3) for labels (N, 5); cross_entropy "
                               "and accuracy take class scores (N, ..., C)")  # fmt: skip


@pytest.mark.torch
@pytest.mark.parametrize(
    ("labels", "outputs", "arguments", "message"),
    [
        ("y = np.arange(203) % 13", "10", "",
         "the labels run from 0 to 12, and the model scores 10 classes (0 to 9)"),
        ("y = x[:, :2]", "3", "loss=lambda o, y: ((o[:, :2] - y) ** 2).mean(), metrics=['mse']",
         "mse compares outputs (N, 3) with labels (N, 2) element by element"),
        ("y = x[:, 0]", "1", "loss=lambda o, y: ((o[:, 0] - y) ** 2).mean(), metrics=[scalar]",
         "metric scalar returned 0.5; a metric returns (sum, count) over its batch"),
        ("y = x[:, 0]", "1", "",
         "data()'s train labels are float32, and cross_entropy needs one integer class label"),
    ],
)  # fmt: skip
def test_what_the_loss_and_metrics_cannot_take_is_one_line(
    labels, outputs, arguments, message, tmp_path
):
    extra = "def scalar(outputs, labels):\n    return 0.5\n"
    recipe = write_recipe(tmp_path, labels, outputs, arguments, extra)
    result = hvd_train("--recipe", recipe, "--output-dir", str(tmp_path / "r"))
    assert_usage_error(result, message)
    assert not list((tmp_path / "r").glob("checkpoints/*"))


RESIZED = """
from torch import nn
from hvd_train import Data, Recipe, Schedule

recipe = Recipe(
    data=Data("synthetic", input_shape=[12, 12, 1], num_classes=4, train_samples=64,
              test_samples=16, transforms=[{"type": "resize", "height": 8, "width": 8}]),
    torch_model=lambda: nn.Sequential(nn.Flatten(), nn.Linear(64, 4)),
    schedule=Schedule(epochs=1, batch_size=16),
)
"""


@pytest.mark.torch
def test_a_model_of_the_resized_shape_trains(tmp_path):
    # The check of the outputs before training takes its examples resized, as training does.
    recipe = tmp_path / "resized.py"
    recipe.write_text(RESIZED)
    result = hvd_train("--recipe", str(recipe), "--output-dir", str(tmp_path / "r"))
    assert result.returncode == 0, result.stderr
    assert json.loads((tmp_path / "r" / "summary.json").read_text())["epochs"] == 1
