import re
from pathlib import Path

import pytest

from hvd_train.errors import UsageError
from hvd_train.recipe import load_recipe, packaged_recipes, parse_recipe

GOOD = (Path(__file__).resolve().parent.parent / "recipes" / "mnist_cnn.toml").read_text()


def parse(text: str):
    return parse_recipe(text, "test", "test.toml")


def test_packaged_recipe_loads_by_name():
    recipe = load_recipe("mnist_cnn")
    assert "mnist_cnn" in packaged_recipes()
    assert recipe.input_shape == (28, 28, 1)
    assert recipe.layers[0].type == "conv2d" and recipe.layers[0].params["filters"] == 32
    assert recipe.layers[-1].type == "softmax"
    assert recipe.schedule.batch_size == 64 and recipe.optimizer.name == "adam"


def test_recipe_loads_by_path(tmp_path):
    path = tmp_path / "mine.toml"
    path.write_text(GOOD.replace("epochs = 4", "epochs = 7"))
    recipe = load_recipe(str(path))
    assert recipe.name == "mine" and recipe.schedule.epochs == 7


def test_overrides_replace_only_what_is_given():
    recipe = load_recipe("mnist_cnn").with_overrides(epochs=1, batch_size=None, learning_rate=0.5)
    assert recipe.schedule.epochs == 1
    assert recipe.schedule.batch_size == 64
    assert recipe.optimizer.learning_rate == 0.5


def test_architecture_hash_follows_layers_only():
    recipe = load_recipe("mnist_cnn")
    assert (
        recipe.architecture_hash()
        == parse(GOOD.replace("epochs = 4", "epochs = 9")).architecture_hash()
    )
    assert (
        recipe.architecture_hash()
        != parse(GOOD.replace("units = 128", "units = 64")).architecture_hash()
    )


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        ("epochs = 4", "epochs = [", "not valid TOML"),
        (
            'type = "conv2d", filters = 32',
            'type = "conv3d", filters = 32',
            "model.layers[0].type: unknown value 'conv3d'",
        ),
        ("epochs = 4", "", "schedule.epochs: missing"),
        ("epochs = 4", "epochs = 0", "schedule.epochs: 0 is out of range"),
        (
            "learning_rate = 0.001",
            "learning_rate = -0.1",
            "optimizer.learning_rate: -0.1 is out of range",
        ),
        ("batch_size = 64", "batch_size = 6.5", "schedule.batch_size: expected int, got 6.5"),
        ("rate = 0.5", "rate = 1.0", "model.layers[9].rate: 1.0 is out of range"),
        ('name = "adam"', 'name = "adagrad"', "optimizer.name: unknown value 'adagrad'"),
        ('decay = "cosine"', 'decay = "cosine"\ndecya = 1', "schedule.decya: unknown key"),
        ("filters = 32,", "filters = 32, strides = 2,", "model.layers[0].strides: unknown key"),
        ('{ type = "softmax" },', "", "model.layers: must end with a softmax layer"),
        ("units = 10 }", "units = 7 }", "model.layers: must end with a dense layer of 10 units"),
        (
            "kernel_size = 5 }",
            "kernel_size = 29 }",
            "model.layers[0]: conv2d does not fit its input",
        ),
        ('{ type = "flatten" },', "", "model.layers[6]: dense needs a flat input; add a flatten"),
        (
            "input_shape = [28, 28, 1]",
            "input_shape = [28, 28]",
            "data.input_shape: expected [height, width, channels]",
        ),
    ],
)
def test_bad_recipe_names_file_key_and_problem(old, new, message):
    assert old in GOOD
    with pytest.raises(UsageError, match="^" + re.escape(f"test.toml: {message}")) as error:
        parse(GOOD.replace(old, new))
    assert "\n" not in str(error.value)


def test_unknown_recipe_lists_the_known_ones():
    with pytest.raises(UsageError, match="unknown recipe 'nope'; use one of mnist_cnn"):
        load_recipe("nope")


def test_missing_recipe_file():
    with pytest.raises(UsageError, match="cannot read recipe missing.toml"):
        load_recipe("missing.toml")
