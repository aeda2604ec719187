"""Python recipes: found by file or module, named, hashed, and every mistake in their
settings reported as a TOML recipe's would be, naming the file."""

import re
import sys

import pytest

from hvd_train.errors import UsageError
from hvd_train.recipe import is_python_reference, load_recipe

GOOD = """
from hvd_train import Data, Optimizer, Recipe, Schedule
from hvd_train import Callback, Checkpoints, Loading

def model():
    raise AssertionError("not built in these tests")

recipe = Recipe(data=Data("synthetic"), torch_model=model, optimizer=OPTIMIZER,
                schedule=Schedule(epochs=2))
"""


def write(tmp_path, text: str, name: str = "mine.py", optimizer: str = "Optimizer()") -> str:
    path = tmp_path / name
    path.write_text(text.replace("OPTIMIZER", optimizer))
    return str(path)


@pytest.mark.parametrize(
    ("reference", "python"),
    [("mnist_cnn", False), ("my.toml", False), ("dir/my.toml", False), ("r.py", True),
     ("dir/r.py:other", True), ("package.module:recipe", True), ("package.module", True)],
)  # fmt: skip
def test_references_to_python_code_are_told_apart(reference, python):
    assert is_python_reference(reference) is python


def test_a_recipe_file_loads_with_its_name_source_and_code_hash(tmp_path):
    recipe = load_recipe(write(tmp_path, GOOD))
    assert recipe.name == "mine" and recipe.source == f"{tmp_path / 'mine.py'}:recipe"
    assert recipe.schedule.epochs == 2 and recipe.frameworks == ("torch",)
    assert recipe.layout("torch") == "torch"
    changed = load_recipe(write(tmp_path, GOOD + "\n# a change\n", name="other.py"))
    assert changed.code_hash != recipe.code_hash
    assert changed.recipe_hash() != recipe.recipe_hash()


def test_another_object_by_name_and_a_module_by_import(tmp_path, monkeypatch):
    text = GOOD + "\nsmall = Recipe(data=Data('synthetic'), keras_model=model)\n"
    path = write(tmp_path, text, name="recipes_mod.py")
    small = load_recipe(f"{path}:small")
    assert small.frameworks == ("torch", "tensorflow") and small.layout("torch") == "keras"
    monkeypatch.syspath_prepend(str(tmp_path))
    assert load_recipe("recipes_mod:small").source == "recipes_mod:small"
    sys.modules.pop("recipes_mod", None)


@pytest.mark.parametrize(
    ("text", "optimizer", "message"),
    [
        (GOOD, "Optimizer(learning_rate=-1)",
         "mine.py: optimizer.learning_rate: -1.0 is out of range; it must be positive"),
        (GOOD, "Optimizer(name='adagrad')", "mine.py: optimizer.name: unknown value 'adagrad'"),
        (GOOD, "Optimizer(momentum=float('nan'))",
         "mine.py: optimizer.momentum: nan is not a finite number"),
        (GOOD, "Optimizer(name='adam', nesterov=True)",
         'mine.py: optimizer.nesterov: set, but nothing chosen reads it (only optimizer.name = '
         '"sgd" does); choose that, or leave nesterov out'),
        (GOOD, "Optimizer(name='sgd', nesterov=True)", "optimizer.nesterov: Nesterov momentum"),
        (GOOD, "Optimizer(weight_decay_exclude='bias')",
         'mine.py: optimizer.weight_decay_exclude: expected a list of words, like ["bias", '
         '"norm"]'),
        (GOOD, "Optimizer(weight_decay_exclude=['bias', ''])",
         "optimizer.weight_decay_exclude: expected a list of words"),
        (GOOD, "{'name': 'sgd'}", "mine.py: optimizer: expected Optimizer(...)"),
        (GOOD, "Optimizer(function=3)",
         "mine.py: optimizer.function: expected a function making the optimizer, got 3"),
        (GOOD, "Optimizer(function=model, learning_rate=0.1)",
         "mine.py: optimizer.learning_rate: the optimizer is made by optimizer.function; give "
         "this setting to the optimizer it makes (only gradient_clip_norm applies beside it)"),
        (GOOD.replace("torch_model=model", "torch_model=model, layers=[1]"), "Optimizer()",
         "mine.py: model: give either layers (the neutral list) or torch_model"),
        (GOOD.replace("torch_model=model, ", ""), "Optimizer()", "mine.py: model: give either"),
        (GOOD.replace("torch_model=model", "torch_model=model, loss='mse'"), "Optimizer()",
         "mine.py: model.loss: unknown value 'mse'"),
        (GOOD.replace('data=Data("synthetic")', "data=3"), "Optimizer()",
         "mine.py: data: expected Data(...) or a function"),
        (GOOD.replace('Data("synthetic")', 'Data("npz")'), "Optimizer()",
         "mine.py: data.path: missing; npz data needs it"),
        (GOOD.replace("recipe =", "something ="), "Optimizer()",
         "mine.py: recipe is nothing, not a hvd_train.Recipe; define recipe = "),
        (GOOD.replace("recipe = Recipe(", "recipe = dict("), "Optimizer()",
         "mine.py: recipe is a dict, not a hvd_train.Recipe"),
        (GOOD + "\nif True\n", "Optimizer()", "mine.py:11: expected ':'; fix the recipe's syntax"),
        (GOOD.replace("torch_model=model", "torch_model=model, callbacks=[Callback]"),
         "Optimizer()", "mine.py: callbacks: Callback is a class; give an object of it"),
        (GOOD.replace("torch_model=model", "torch_model=model, callbacks=[print]"),
         "Optimizer()", "mine.py: callbacks: <built-in function print> is not a callback; "
         "subclass hvd_train.Callback"),
        (GOOD.replace("epochs=2)", "epochs=2, early_stopping={'patience': 2})"), "Optimizer()",
         "mine.py: schedule.early_stopping: it watches the validation split, which this recipe "
         "has none of; set data.validation_fraction (0.1 is usual)"),
        (GOOD.replace("epochs=2)", "epochs=2, early_stopping={'monitor': 'val_acc'})")
         .replace("model, optimizer", "model, loading=Loading(validation_fraction=0.1), optimizer"),
         "Optimizer()", "mine.py: schedule.early_stopping.monitor: the run reports no 'val_acc'; "
         "choose one of val_loss, val_accuracy"),
        (GOOD.replace("model, optimizer", "model, checkpoints=Checkpoints(keep_best=1), optimizer"),
         "Optimizer()", "mine.py: checkpoints.keep_best: it watches the validation split"),
        (GOOD.replace("model, optimizer", "model, loading=Loading(validation_fraction=0.1), "
                      "checkpoints=Checkpoints(keep_best=1, monitor='val_mse'), optimizer"),
         "Optimizer()", "mine.py: checkpoints.monitor: the run reports no 'val_mse'; choose one "
         "of val_loss, val_accuracy"),
        (GOOD.replace("epochs=2)", "epochs=2, early_stopping={'wait': 2})"), "Optimizer()",
         "mine.py: schedule.early_stopping.wait: unknown key; use monitor, patience, mode, "
         "min_delta"),
        (GOOD.replace("epochs=2)", "epochs=2, early_stopping={'patience': 0})"), "Optimizer()",
         "mine.py: schedule.early_stopping.patience: 0 is out of range; it must be positive"),
        (GOOD.replace("epochs=2)", "epochs=2, early_stopping=3)"), "Optimizer()",
         "mine.py: schedule.early_stopping: expected a table, like { monitor = "),
        (GOOD.replace("torch_model=model", "torch_model=model, callbacks=Callback()"),
         "Optimizer()", "mine.py: callbacks: expected a list of callbacks, got <hvd_train"),
    ],
)  # fmt: skip
def test_mistakes_in_a_python_recipe_are_one_line_naming_the_file(
    tmp_path, text, optimizer, message
):
    with pytest.raises(UsageError, match=re.escape(message)) as error:
        load_recipe(write(tmp_path, text, optimizer=optimizer))
    assert "\n" not in str(error.value)


def test_missing_recipe_file_and_module():
    with pytest.raises(
        UsageError,
        match="cannot read recipe nowhere.py: No such file or directory; check the --recipe path",
    ):
        load_recipe("nowhere.py")
    with pytest.raises(UsageError, match="cannot import recipe module 'no_such_package.x'"):
        load_recipe("no_such_package.x:recipe")


def test_an_error_in_the_recipes_own_code_keeps_its_traceback(tmp_path):
    with pytest.raises(ZeroDivisionError):
        load_recipe(write(tmp_path, "1 / 0\n"))


@pytest.mark.parametrize(
    "content", [b"\x00\x01\x02binary", b"\xff\xfe not utf-8", b"recipe = 1\x00\n"]
)
def test_a_recipe_file_that_is_not_python_is_one_line(tmp_path, content):
    path = tmp_path / "mine.py"
    path.write_bytes(content)
    with pytest.raises(UsageError, match=rf"^{tmp_path}/mine.py is not Python source \(") as error:
        load_recipe(str(path))
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("content", [b"\x00\x01\x02binary", b"\xff\xfe[data]", b"[data\n"])
def test_a_toml_recipe_that_is_not_toml_is_one_line(tmp_path, content):
    path = tmp_path / "mine.toml"
    path.write_bytes(content)
    with pytest.raises(UsageError, match=rf"{tmp_path}/mine.toml") as error:
        load_recipe(str(path))
    assert "\n" not in str(error.value)


def test_a_python_recipes_own_data_takes_the_data_workers_settings(tmp_path):
    text = GOOD.replace('data=Data("synthetic")', "data=lambda: None, loading=Loading(workers=2)")
    text = text.replace("from hvd_train import Data,", "from hvd_train import Data, Loading,")
    recipe = load_recipe(write(tmp_path, text))
    assert (recipe.loading.workers, recipe.loading.prefetch) == (2, 2)
    changed = recipe.with_overrides({"data.workers": "auto", "data.prefetch": 8})
    assert (changed.loading.workers, changed.loading.prefetch) == ("auto", 8)
    assert changed.settings_table()["data"] == {"python": f"python recipe {recipe.source}",
                                                "workers": "auto", "prefetch": 8,
                                                "timeout": 300.0,
                                                "validation_fraction": 0.0}  # fmt: skip
    with pytest.raises(UsageError, match=r"^data: this recipe's data is a Python function"):
        recipe.with_overrides({"data.dataset": "mnist"})


def test_a_python_recipes_own_optimizer_is_recorded_by_name_and_only_clipping_overrides(tmp_path):
    text = GOOD.replace("def model():", "def make(module):\n    return module\n\ndef model():")
    recipe = load_recipe(write(tmp_path, text, optimizer="make"))
    assert recipe.optimizer.function.__name__ == "make"
    assert recipe.settings_table()["optimizer"] == {"function": "python function make",
                                                     "gradient_clip_norm": 0.0}  # fmt: skip
    clipped = recipe.with_overrides({"optimizer.gradient_clip_norm": 1.0})
    assert (clipped.optimizer.function, clipped.optimizer.gradient_clip_norm) == (
        recipe.optimizer.function, 1.0)  # fmt: skip
    with pytest.raises(UsageError, match=r"^optimizer.momentum: the optimizer is made by"):
        recipe.with_overrides({"optimizer.momentum": 0.9})
