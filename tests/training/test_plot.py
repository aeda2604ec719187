"""`hvd-train plot`: the picture has one panel per metric and one curve per run and metric."""

import json
import subprocess
import sys

import matplotlib.image

from hvd_train.training.plot import plot_runs


def fake_run(directory, framework: str, world_size: int, slope: float, split: str = "test"):
    """Records of 3 epochs, each evaluated on `split`; with "val", the test set once at the end."""
    directory.mkdir()
    records = []
    for epoch in range(1, 4):
        for part in range(1, 5):
            progress = epoch - 1 + part / 4
            records.append({"kind": "train", "epochs": progress, "loss": slope / progress,
                            "learning_rate": 0.001 * world_size})  # fmt: skip
        records.append({"kind": "eval", "epochs": epoch, f"{split}_loss": slope / epoch / 2,
                        f"{split}_accuracy": 1 - slope / epoch / 10})  # fmt: skip
    if split == "val":
        records.append({"kind": "eval", "epochs": 3, "test_loss": slope / 6,
                        "test_accuracy": 1 - slope / 30})  # fmt: skip
    (directory / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    summary = {"recipe": "mnist_cnn", "framework": framework, "world_size": world_size}
    (directory / "summary.json").write_text(json.dumps(summary))
    return directory


def test_two_runs_side_by_side(tmp_path):
    runs = [
        fake_run(tmp_path / "a", "torch", 2, 0.5),
        fake_run(tmp_path / "b", "tensorflow", 1, 0.3, split="val"),
    ]
    output = tmp_path / "curves.png"
    assert plot_runs(runs, output) == ["loss", "accuracy", "learning rate"]
    picture = matplotlib.image.imread(output)
    assert picture.shape[:2] == (400, 1500)  # three panels of 5 x 4 inches at 100 dpi
    # Each panel has ink from both runs: the two colours of matplotlib's first two lines.
    thirds = [picture[:, i * 500 : (i + 1) * 500, :3] for i in range(3)]
    for panel in thirds:
        blue = ((abs(panel - [0.12, 0.47, 0.71]) < 0.05).all(axis=2)).sum()
        orange = ((abs(panel - [1.0, 0.5, 0.05]) < 0.05).all(axis=2)).sum()
        assert blue > 100 and orange > 100


def test_the_command_writes_the_picture_or_says_why_not(tmp_path):
    run = fake_run(tmp_path / "run", "torch", 2, 0.5)
    command = [sys.executable, "-m", "hvd_train", "plot", str(run), "-o", str(tmp_path / "x.png")]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and (tmp_path / "x.png").exists(), result.stderr
    result = subprocess.run([*command[:4], str(tmp_path / "nowhere")], capture_output=True,
                            text=True, timeout=120)  # fmt: skip
    assert result.returncode == 2
    assert f"cannot read {tmp_path}/nowhere/metrics.jsonl" in result.stderr
