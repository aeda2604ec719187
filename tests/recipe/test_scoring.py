"""scoring.py and the recipe's metrics: each built-in against a direct count, per position too,
and a metric named wrongly is one line."""

import numpy as np
import pytest

from hvd_train.errors import UsageError
from hvd_train.recipe import Data, Recipe
from hvd_train.recipe.scoring import (
    accuracy,
    describe,
    evaluation_figures,
    mae,
    mse,
    top_k_accuracy,
)

RNG = np.random.default_rng(0)


def test_accuracy_counts_every_position():
    outputs = RNG.normal(size=(4, 6, 3))  # 4 sequences of 6 positions, 3 classes
    labels = RNG.integers(0, 3, size=(4, 6))
    correct = sum(int(np.argmax(outputs[i, j]) == labels[i, j]) for i in range(4) for j in range(6))
    assert accuracy(outputs, labels) == (correct, 24)


def test_top_k_accuracy_is_whether_the_label_is_among_the_five_largest():
    outputs = np.tile(np.arange(10.0), (3, 1))  # class 9 scores highest, then 8, ...
    assert top_k_accuracy(outputs, np.array([9, 5, 4])) == (2, 3)
    assert top_k_accuracy(outputs[:, :3], np.array([0, 1, 2])) == (3, 3)  # fewer than 5 classes


def test_mse_and_mae_sum_over_every_element_and_take_labels_n_for_outputs_n_1():
    outputs = np.array([[1.0], [2.0], [4.0]], np.float32)
    labels = np.array([0.0, 2.0, 2.0], np.float32)
    assert mse(outputs, labels) == (5.0, 3) and mae(outputs, labels) == (3.0, 3)
    assert mse(np.ones((2, 3)), np.zeros((2, 3))) == (6.0, 6)


def test_describe_shows_each_figure_by_name():
    summary = {"test_loss": 0.03125, "test_accuracy": 0.9905, "test_mse": 0.5, "epochs": 2}
    assert describe(evaluation_figures(summary)) == (
        "test loss 0.0312, test accuracy 99.05%, test mse 0.5000"
    )


def iou(outputs, labels):
    return 1.0, 1


def recipe(**keywords) -> Recipe:
    return Recipe(data=Data("mnist"), torch_model=lambda: None, **keywords)


def test_the_default_metrics_follow_the_loss():
    assert list(recipe().metric_functions) == ["accuracy"]
    assert list(recipe(loss=lambda o, y: o).metric_functions) == []
    chosen = recipe(loss=lambda o, y: o, metrics=("mae", iou)).metric_functions
    assert chosen == {"mae": mae, "iou": iou}
    assert recipe(metrics=["mse"]).settings_table()["model"]["metrics"] == ["mse"]
    assert "metrics" not in recipe().settings_table()["model"]  # the default is not recorded


@pytest.mark.parametrize(
    ("metrics", "message"),
    [
        (("accuracy", "f1"), "model.metrics: unknown metric 'f1'; choose from accuracy, "
                             "top_k_accuracy, mse, mae or give a function"),
        ((lambda o, y: (0, 1),), "is not a metric; give a named function (def, not lambda)"),
        ((3,), "model.metrics: 3 is not a metric"),
        ("accuracy", "model.metrics: expected a list of metrics, got 'accuracy'"),
        (("mse", "mse"), "model.metrics: ['mse', 'mse'] names a metric twice"),
    ],
)  # fmt: skip
def test_a_wrong_metric_is_one_line(metrics, message):
    with pytest.raises(UsageError, match="^") as error:
        recipe(metrics=metrics)
    assert message in str(error.value)
