"""resume.py: what a resumed run takes from its checkpoint, and every check that a checkpoint
fits the run (or the eval) it is given to."""

import json
from pathlib import Path

import numpy as np
import pytest

from hvd_train.distributed import Found, saved_framework
from hvd_train.distributed.checkpoint_files import Checkpoint, check_weights_fit, checkpoint_name
from hvd_train.errors import UsageError
from hvd_train.recipe import load_recipe
from hvd_train.recipe.toml import recipe_toml
from hvd_train.training.position import Position
from hvd_train.training.resume import (
    check_continues,
    check_layout,
    check_same_run,
    resumed_option,
    saved_recipe,
)

WEIGHTS = {"layer0.kernel": np.zeros((3, 3, 1, 8), np.float32), "layer0.bias": np.zeros(8)}


def checkpoint(layout="neutral", framework="torch", weights=WEIGHTS) -> Checkpoint:
    state = {"layout": layout, "framework": framework, "recipe": "mine"}
    return Checkpoint(Path("run/checkpoints/epoch-1"), weights, {}, state, "")


def found(state: dict, path: str = "ckpt", recipe_text: str = "") -> Found:
    """A checkpoint as `find` hands it to every rank: its path, state and recipe."""
    return Found(Path(path), state, recipe_text, None)


def read(held: Checkpoint) -> Found:
    return Found(held.path, held.state, held.recipe_text, held)


def test_the_framework_to_resume_with_is_the_newest_checkpoints(tmp_path):
    assert saved_framework(tmp_path) is None  # no run there: the default framework applies
    for epoch, framework in ((1, "torch"), (2, "tensorflow")):
        folder = tmp_path / "checkpoints" / checkpoint_name(epoch, 0)
        folder.mkdir(parents=True)
        (folder / "state.json").write_text(json.dumps({"framework": framework}))
    assert saved_framework(tmp_path) == "tensorflow"
    (tmp_path / "checkpoints" / checkpoint_name(2, 0) / "state.json").write_text("{")
    assert saved_framework(tmp_path) is None  # unreadable: the checkpoint's check says why


def test_only_more_epochs_and_how_batches_are_read_may_differ_from_the_checkpoints_recipe():
    saved = load_recipe("mnist_cnn")
    check_same_run(saved, saved.with_overrides({"epochs": 9}), "ckpt")
    check_same_run(saved, saved.with_overrides({"data.workers": 4, "data.prefetch": 8}), "ckpt")
    with pytest.raises(UsageError, match=r"^--resume: optimizer.learning_rate is 0.5 here but "):
        check_same_run(saved, saved.with_overrides({"learning_rate": 0.5}), "ckpt")


def test_a_resumed_option_is_the_runs_own_unless_contradicted():
    state = found({"framework": "torch", "loop": {"seed": 7, "limit_steps": None}})
    assert resumed_option(state, "--seed", None) == 7
    assert resumed_option(state, "--seed", 7) == 7
    assert resumed_option(state, "--limit-steps", None) is None
    with pytest.raises(UsageError, match=r"--seed 8 differs from the run's 7 \(checkpoint ckpt\)"):
        resumed_option(state, "--seed", 8)
    with pytest.raises(UsageError, match="--limit-steps 5 differs from the run's none"):
        resumed_option(state, "--limit-steps", 5)
    # hvd_train 0.2.0's trainer kept them among state.json's own keys
    assert resumed_option(found({"seed": 7, "limit_steps": 3}), "--limit-steps", None) == 3


def test_weights_must_fit_name_for_name_and_shape_for_shape():
    check_weights_fit(checkpoint(), dict(WEIGHTS), "use the recipe")
    fewer = {"layer0.kernel": WEIGHTS["layer0.kernel"]}
    with pytest.raises(UsageError, match=r"layer0.bias: \(8,\) there, absent here\); use the rec"):
        check_weights_fit(checkpoint(), fewer, "use the recipe")
    wider = dict(WEIGHTS, **{"layer0.bias": np.zeros(16)})
    with pytest.raises(UsageError, match=r"layer0.bias: \(8,\) there, \(16,\) here"):
        check_weights_fit(checkpoint(), wider, "use the recipe")


def test_only_the_neutral_layout_moves_between_frameworks():
    check_layout(read(checkpoint("neutral", "tensorflow")), "torch", "neutral")
    check_layout(read(checkpoint("keras", "tensorflow")), "torch", "keras")  # a Keras model's
    with pytest.raises(UsageError, match="use --framework torch"):
        check_layout(read(checkpoint("torch", "torch")), "tensorflow", "torch")
    with pytest.raises(UsageError, match="holds neutral weights .* keeps torch weights"):
        check_layout(read(checkpoint("neutral")), "torch", "torch")


def test_a_run_resumes_in_its_framework_and_only_to_train_on():
    check_continues(read(checkpoint()), "torch", Position(1, 0), epochs=2, output_dir=Path("run"))
    with pytest.raises(UsageError, match="written by torch; resume it with --framework torch"):
        check_continues(read(checkpoint()), "tensorflow", Position(1, 0), 2, Path("run"))
    with pytest.raises(UsageError, match="already finished 2 epochs; raise --epochs"):
        check_continues(read(checkpoint()), "torch", Position(2, 0), 2, Path("run"))


def test_a_python_recipes_own_decay_resumes_from_its_code(tmp_path):
    source = tmp_path / "mine.py"
    source.write_text(
        "import torch\n"
        "from hvd_train import Recipe, Schedule\n"
        "def halve(step, steps):\n    return 0.5\n"
        "recipe = Recipe(data=lambda: None, torch_model=lambda: torch.nn.Linear(2, 2),\n"
        "                schedule=Schedule(epochs=3, decay=halve))\n"
    )
    recipe = load_recipe(str(source))
    assert recipe.settings_table()["schedule"]["decay"] == "python function halve"
    state = {"layout": "torch", "recipe_source": str(source)}
    saved = saved_recipe(found(state, str(tmp_path), recipe_toml(recipe)))
    assert saved.schedule.decay.__name__ == "halve" and saved.schedule.epochs == 3
    check_same_run(saved, recipe, "ckpt")


def test_a_neutral_python_recipes_own_optimizer_and_decay_come_back_from_its_code(tmp_path):
    # Its saved TOML names the functions, which only the code gives back.
    source = tmp_path / "mine.py"
    source.write_text(
        "from hvd_train import Data, Recipe, Schedule\n"
        "def make(model=None):\n    return None\n"
        "def halve(step, steps):\n    return 0.5\n"
        "recipe = Recipe(data=Data('synthetic', input_shape=(4, 4, 1), num_classes=2),\n"
        "                layers=({'type': 'flatten'}, {'type': 'dense', 'units': 2},\n"
        "                        {'type': 'softmax'}),\n"
        "                optimizer=make, schedule=Schedule(epochs=3, decay=halve))\n"
    )
    recipe = load_recipe(str(source))
    state = {"layout": "neutral", "recipe": "mine", "recipe_source": str(source)}
    text = recipe_toml(recipe.with_overrides({"gradient_clip_norm": 2.0}))
    saved = saved_recipe(found(state, str(tmp_path), text))
    assert saved.optimizer.function.__name__ == "make" and saved.optimizer.gradient_clip_norm == 2
    assert saved.schedule.decay.__name__ == "halve" and saved.schedule.epochs == 3
    check_same_run(saved, recipe.with_overrides({"gradient_clip_norm": 2.0}), "ckpt")
