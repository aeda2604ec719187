import subprocess
import sys

import numpy as np
import pytest

from hvd_train.distributed.checkpoint_files import (
    checkpoint_name,
    checkpoints,
    load_checkpoint,
    load_newest_valid,
    remove_partial,
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
        (lambda p: (p / "model.safetensors").write_bytes(b"garbage"),
         "is corrupt (model.safetensors fails its checksum)"),
        (lambda p: (p / "optimizer.safetensors").unlink(), "is unreadable ("),
        (lambda p: (p / "state.json").write_text("{"), "is unreadable ("),
        (lambda p: (p / "state.json").write_text("[1, 2]"), "is unreadable ("),
        (lambda p: (p / "state.json").write_bytes(b"\xff\xfe\x00garbage"), "is unreadable ("),
        (lambda p: (p / "state.json").write_text(
            (p / "state.json").read_text().replace('"epoch": 1', '"epoch": 2')),
         "is corrupt (state.json fails its checksum)"),
    ],
)  # fmt: skip
def test_damage_is_detected_naming_the_checkpoint(tmp_path, damage, message):
    path = save(tmp_path, 1)
    damage(path)
    with pytest.raises(UsageError) as error:
        load_checkpoint(path)
    assert str(error.value).startswith(f"checkpoint {path} {message}"), error.value
    assert str(error.value).endswith("; use an earlier checkpoint or start anew")


def test_a_failed_write_is_one_line_leaves_nothing_and_keeps_the_earlier_checkpoints(tmp_path):
    earlier = save(tmp_path, 1)
    before = {p: p.read_bytes() for p in earlier.iterdir()}
    # A file-size limit makes the write fail halfway, as a full disk would (root ignores
    # permissions, so a read-only folder would not do).
    code = f"""
import resource, signal, sys
from pathlib import Path
import numpy as np
from hvd_train.distributed.checkpoint_files import save_checkpoint
from hvd_train.errors import UsageError
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
try:
    save_checkpoint(Path({str(tmp_path)!r}), "epoch-0002-sample-00000000",
                    {{"w": np.zeros(100000, np.float32)}}, {{}}, {{"epoch": 2}}, "", 3)
except UsageError as error:
    print(error)
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    message = result.stdout.strip()
    assert message.startswith(f"cannot write checkpoint {tmp_path}/epoch-0002-sample-00000000 (")
    assert message.endswith("or choose another --output-dir (the earlier checkpoints are intact)")
    assert "\n" not in message
    assert sorted(p.name for p in tmp_path.iterdir()) == [earlier.name]  # no partial left
    assert {p: p.read_bytes() for p in earlier.iterdir()} == before


def test_leftovers_of_a_killed_writer_are_removed(tmp_path):
    save(tmp_path, 1)
    (tmp_path / ".epoch-0002-sample-00000000.partial-123").mkdir()
    (tmp_path / ".epoch-0002-sample-00000000.partial-123" / "model.safetensors").write_text("x")
    remove_partial(tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == [checkpoint_name(1, 0)]


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
