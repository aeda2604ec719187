import re
from pathlib import Path

import pytest

from hvd_train.errors import UsageError
from hvd_train.recipe import Data, Loading, Optimizer, Schedule, load_recipe
from hvd_train.recipe.toml import packaged_recipes, parse_toml_recipe, recipe_toml
from tests.conftest import REPO

GOOD = (REPO / "recipes" / "mnist_cnn.toml").read_text()
MINIMAL = """
[data]
dataset = "mnist"
[model]
layers = [{ type = "flatten" }, { type = "dense", units = 10 }, { type = "softmax" }]
"""


def parse(text: str):
    return parse_toml_recipe(text, "test", "test.toml", Path("/recipes"))


def test_packaged_recipes_load_by_name():
    assert {"mnist_cnn", "mnist_bn"} <= set(packaged_recipes())
    recipe = load_recipe("mnist_cnn")
    assert recipe.data.input_shape == (28, 28, 1)
    assert recipe.layers[0].type == "conv2d" and recipe.layers[0].params["filters"] == 32
    assert recipe.layers[0].params["padding"] == "valid" and recipe.layers[0].params["stride"] == 1
    assert recipe.schedule.batch_size == 64 and recipe.optimizer.name == "adam"
    assert load_recipe("mnist_bn").frameworks == ("torch", "tensorflow")


def test_a_packaged_python_recipe_loads_by_name_too():
    assert "resnet18" in packaged_recipes() and "__init__" not in packaged_recipes()
    recipe = load_recipe("resnet18")
    assert recipe.name == "resnet18" and recipe.source == "hvd_train.recipes.resnet18:recipe"
    assert recipe.frameworks == ("torch", "tensorflow") and recipe.layout("torch") == "torch"
    assert recipe.data.input_shape == (32, 32, 3) and recipe.data.dataset == "synthetic"


def test_recipe_loads_by_path(tmp_path):
    path = tmp_path / "mine.toml"
    path.write_text(GOOD.replace("epochs = 2", "epochs = 7"))
    recipe = load_recipe(str(path))
    assert recipe.name == "mine" and recipe.schedule.epochs == 7


def test_a_minimal_recipe_takes_the_documented_defaults():
    recipe = parse(MINIMAL)
    assert recipe.optimizer == Optimizer(name="adam", learning_rate=0.001)
    assert recipe.schedule == Schedule(epochs=1, batch_size=64, lr_scaling="linear",
                                       warmup_epochs=0.0, decay="none")  # fmt: skip
    assert recipe.data == Data("mnist", input_shape=(28, 28, 1), num_classes=10)
    assert recipe.loss == "cross_entropy" and recipe.horovod.backward_passes_per_step == 1
    assert recipe.loading == Loading(workers="auto", prefetch=2)


def test_how_batches_are_read_is_said_in_data_and_set_like_any_key():
    recipe = parse(MINIMAL.replace('dataset = "mnist"', 'dataset = "mnist"\nworkers = 3'))
    assert recipe.loading == Loading(workers=3) and recipe.data == Data("mnist")
    assert recipe.settings_table()["data"] == {
        "dataset": "mnist",
        "input_shape": [28, 28, 1],
        "num_classes": 10,
        "workers": 3,
        "prefetch": 2,
        "timeout": 300.0,
        "validation_fraction": 0.0,
    }
    again = recipe.with_overrides({"data.workers": 2, "prefetch": 4, "validation_fraction": 0.1})
    assert again.loading == Loading(workers=2, prefetch=4, validation_fraction=0.1)
    assert again.data == recipe.data
    assert parse(recipe_toml(again)).loading == again.loading


def test_overrides_replace_only_what_is_given_and_are_checked():
    recipe = load_recipe("mnist_cnn").with_overrides({"epochs": 1, "optimizer.learning_rate": 0.5})
    assert recipe.schedule.epochs == 1 and recipe.schedule.batch_size == 64
    assert recipe.optimizer.learning_rate == 0.5
    with pytest.raises(UsageError, match=r"^schedule.epochs: 0 is out of range"):
        recipe.with_overrides({"schedule.epochs": 0})
    with pytest.raises(UsageError, match=r"^schedule.epoch: unknown setting"):
        recipe.with_overrides({"schedule.epoch": 2})
    with pytest.raises(UsageError, match=r"^optimizer.epochs: unknown setting"):
        recipe.with_overrides({"optimizer.epochs": 2})


def test_the_effective_recipe_round_trips_through_toml(tmp_path):
    recipe = load_recipe("mnist_bn").with_overrides({"epochs": 9, "compression": "bf16"})
    again = parse(recipe_toml(recipe))
    assert again.settings_table() == recipe.settings_table()
    assert again.recipe_hash() == recipe.recipe_hash() != load_recipe("mnist_bn").recipe_hash()


def test_a_relative_npz_path_is_taken_from_the_recipes_folder():
    text = MINIMAL.replace('dataset = "mnist"', 'dataset = "npz"\npath = "../data/mine.npz"\n'
                           "input_shape = [28, 28, 1]\nnum_classes = 10")  # fmt: skip
    assert parse(text).data.path == "/data/mine.npz"


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        ("epochs = 2", "epochs = [", "not valid TOML"),
        ('type = "conv2d", filters = 32', 'type = "conv3d", filters = 32',
         "model.layers[0].type: unknown value 'conv3d'"),
        ("epochs = 2", "epochs = 0", "schedule.epochs: 0 is out of range"),
        ("learning_rate = 0.001", "learning_rate = -0.1",
         "optimizer.learning_rate: -0.1 is out of range"),
        ("learning_rate = 0.001", "learning_rate = nan",
         "optimizer.learning_rate: nan is not a finite number"),
        ("weight_decay = 0.0", "weight_decay = inf",
         "optimizer.weight_decay: inf is not a finite number"),
        ("batch_size = 64", "batch_size = 6.5", "schedule.batch_size: expected int, got 6.5"),
        ("rate = 0.5", "rate = 1.0", "model.layers[9].rate: 1.0 is out of range"),
        ('name = "adam"', 'name = "adagrad"', "optimizer.name: unknown value 'adagrad'"),
        ('decay = "cosine"', 'decay = "cosine"\ndecya = 1', "schedule.decya: unknown key"),
        ("filters = 32,", "filters = 32, strides = 2,", "model.layers[0].strides: unknown key"),
        ("filters = 32,", 'filters = 32, padding = "full",',
         "model.layers[0].padding: unknown value 'full'; choose one of valid, same"),
        ('{ type = "softmax" },', "", "model.layers: must end with a softmax layer"),
        ("units = 10 }", "units = 7 }", "model.layers: must end with a dense layer of 10 units"),
        ("kernel_size = 5 }", "kernel_size = 29 }",
         "model.layers[0]: conv2d does not fit its input"),
        ('{ type = "flatten" },', "", "model.layers[6]: dense needs a flat input; add a flatten"),
        ("input_shape = [28, 28, 1]", "input_shape = [28, 28, 3]",
         "data.input_shape: mnist data has [28, 28, 1]; leave it out or give that"),
        ('dataset = "mnist"', 'dataset = "npz"', "data.path: missing; npz data needs it"),
        ("[horovod]", "[horovd]", "horovd: unknown table or key"),
        ("[data]", "[dat]", "dat: unknown table or key"),
        ('dataset = "mnist"', 'dataset = "mnist"\nworkers = "many"',
         "data.workers: unknown value 'many'; give a number of threads (0: read in the step) "
         'or "auto"'),
        ('dataset = "mnist"', 'dataset = "mnist"\nworkers = -1', "data.workers: unknown value -1"),
        ('dataset = "mnist"', 'dataset = "mnist"\nprefetch = 0',
         "data.prefetch: 0 is out of range"),
    ],
)  # fmt: skip
def test_bad_recipe_names_file_key_and_problem(old, new, message):
    assert old in GOOD
    with pytest.raises(UsageError, match="^" + re.escape(f"test.toml: {message}")) as error:
        parse(GOOD.replace(old, new))
    assert "\n" not in str(error.value)


def test_data_and_model_are_required():
    with pytest.raises(UsageError, match=r"^test.toml: data: missing table; add \[data\]"):
        parse(MINIMAL.replace('[data]\ndataset = "mnist"', ""))
    with pytest.raises(UsageError, match=r"^test.toml: model: missing table"):
        parse('[data]\ndataset = "mnist"\n')


def test_unknown_recipe_lists_the_known_ones():
    with pytest.raises(UsageError, match="unknown recipe 'nope'; use one of mnist_bn, mnist_cnn"):
        load_recipe("nope")


def test_missing_recipe_file():
    with pytest.raises(UsageError, match="cannot read recipe missing.toml"):
        load_recipe("missing.toml")


def test_fp16_compression_of_earlier_recipes_and_checkpoints_reads_as_compression():
    old = GOOD.replace('compression = "none"', "fp16_compression = true")
    assert parse(old).horovod.compression == "fp16"
    assert parse(old.replace("= true", "= false", 1)).horovod.compression == "none"
    both = old.replace("fp16_compression = true", 'fp16_compression = true\ncompression = "bf16"')
    with pytest.raises(UsageError, match="replaced by horovod.compression, which is given too"):
        parse(both)
    with pytest.raises(UsageError, match=r"fp16_compression: expected true or false, got 'yes'"):
        parse(old.replace("fp16_compression = true", 'fp16_compression = "yes"'))
    renamed = r'fp16_compression: renamed; use horovod.compression="fp16"'
    with pytest.raises(UsageError, match=renamed):
        load_recipe("mnist_cnn").with_overrides({"horovod.fp16_compression": True})
