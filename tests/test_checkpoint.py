import numpy as np
import pytest

from hvd_train.checkpoint import (
    checkpoint_name,
    checkpoints,
    load_checkpoint,
    load_newest_valid,
    save_checkpoint,
)
from hvd_train.errors import UsageError

WEIGHTS = {
    "layer0.kernel": np.arange(12, dtype=np.float32).reshape(2, 2, 1, 3),
    "layer0.bias": np.ones(3, np.float32),
}
OPTIMIZER = {"0.exp_avg": np.full((3,), 0.5, np.float32)}


def save(directory, epoch: int, keep: int = 3):
    name = checkpoint_name(epoch, 0)
    return save_checkpoint(directory, name, WEIGHTS, OPTIMIZER, {"epoch": epoch}, "recipe", keep)


def test_round_trip(tmp_path):
    path = save(tmp_path, 7)
    assert path == tmp_path / "epoch-0007-sample-00000000"
    loaded = load_checkpoint(path)
    assert loaded.state["epoch"] == 7 and set(loaded.state["sha256"]) == {
        "model.safetensors", "optimizer.safetensors", "recipe.toml",
    }  # fmt: skip
    assert loaded.recipe_text == "recipe"
    assert all(np.array_equal(loaded.weights[k], v) for k, v in WEIGHTS.items())
    assert np.array_equal(loaded.optimizer["0.exp_avg"], OPTIMIZER["0.exp_avg"])
    assert not list(tmp_path.glob(".*"))


def test_only_the_newest_k_are_kept(tmp_path):
    for step in (10, 20, 30, 40):
        save(tmp_path, step, keep=2)
    assert [p.name for p in checkpoints(tmp_path)] == [
        checkpoint_name(30, 0),
        checkpoint_name(40, 0),
    ]


def test_a_failed_write_leaves_nothing_behind(tmp_path):
    with pytest.raises(TypeError):
        save_checkpoint(tmp_path, "x", WEIGHTS, OPTIMIZER, {"not json": object()}, "", 3)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (
            lambda p: (p / "model.safetensors").write_bytes(b"garbage"),
            "model.safetensors fails its checksum",
        ),
        (lambda p: (p / "optimizer.safetensors").unlink(), "is unreadable"),
        (lambda p: (p / "state.json").write_text("{"), "is unreadable"),
    ],
)
def test_damage_is_detected(tmp_path, damage, message):
    path = save(tmp_path, 1)
    damage(path)
    with pytest.raises(UsageError, match=f"checkpoint .*{path.name} {message}|{message}"):
        load_checkpoint(path)


def test_a_truncated_newest_checkpoint_is_set_aside_for_the_previous(tmp_path, capsys):
    save(tmp_path, 10)
    newest = save(tmp_path, 20)
    data = (newest / "model.safetensors").read_bytes()
    (newest / "model.safetensors").write_bytes(data[: len(data) // 2])
    assert load_newest_valid(tmp_path).path == tmp_path / checkpoint_name(10, 0)
    error = capsys.readouterr().err
    assert f"{newest.name} is corrupt (model.safetensors fails its checksum)" in error
    assert f"set aside as {newest.name}.corrupt, trying the one before" in error
    aside = newest.with_name(newest.name + ".corrupt")
    assert aside.is_dir() and not newest.exists()  # kept for a look, out of the way
    assert checkpoints(tmp_path) == [tmp_path / checkpoint_name(10, 0)]
    save(tmp_path, 20)  # training can write that point again
