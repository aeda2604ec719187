import numpy as np
import pytest

from hvd_train.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from hvd_train.errors import UsageError

WEIGHTS = {
    "layer0.kernel": np.arange(12, dtype=np.float32).reshape(2, 2, 1, 3),
    "layer0.bias": np.ones(3, np.float32),
}
OPTIMIZER = {"0.exp_avg": np.full((3,), 0.5, np.float32)}


def test_round_trip_and_latest(tmp_path):
    save_checkpoint(tmp_path, 1, WEIGHTS, OPTIMIZER, {"epoch": 1}, "")
    path = save_checkpoint(tmp_path, 2, WEIGHTS, OPTIMIZER, {"epoch": 2}, "recipe")
    assert latest_checkpoint(tmp_path) == path == tmp_path / "epoch-0002"
    loaded = load_checkpoint(path)
    assert loaded.state == {"epoch": 2}
    assert loaded.recipe_text == "recipe"
    assert all(np.array_equal(loaded.weights[k], v) for k, v in WEIGHTS.items())
    assert np.array_equal(loaded.optimizer["0.exp_avg"], OPTIMIZER["0.exp_avg"])
    assert not list(tmp_path.glob(".*"))


def test_a_failed_write_leaves_nothing_behind(tmp_path):
    with pytest.raises(TypeError):
        save_checkpoint(tmp_path, 1, WEIGHTS, OPTIMIZER, {"not json": object()}, "")
    assert list(tmp_path.iterdir()) == []
    assert latest_checkpoint(tmp_path) is None


def test_unreadable_checkpoint_is_a_usage_error(tmp_path):
    path = save_checkpoint(tmp_path, 1, WEIGHTS, OPTIMIZER, {"epoch": 1}, "")
    (path / "model.safetensors").write_bytes(b"garbage")
    with pytest.raises(UsageError, match="checkpoint .*epoch-0001 is unreadable"):
        load_checkpoint(path)
