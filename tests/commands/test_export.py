"""`hvd-train export`: each format loads in a fresh process without hvd_train and gives the
checkpoint's outputs, on a batch size the export was not traced with. The checkpoint is a
neutral recipe's written under TensorFlow, so the torch formats also cross frameworks; the
reference outputs are the NumPy forward pass over its saved neutral weights."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file
from safetensors.torch import load_file as load_torch_file

from hvd_train.data import take
from hvd_train.frameworks import EXPORT_FORMATS
from hvd_train.recipe import load_data, load_recipe
from tests.conftest import REPO
from tests.recipes.test_recipes import load_example
from tests.reference import reference_logits

# slow: each trains a run and loads its export in a fresh process (make test-quick leaves it out)
pytestmark = [pytest.mark.slow, pytest.mark.torch, pytest.mark.tensorflow, pytest.mark.timeout(900)]

# Each format's loader, as a user serving the model writes it: x.npy in, outputs.npy out.
LOADERS = {
    "torch": "import torch\n"
             "model = torch.export.load(path).module()\n"
             "outputs = model(torch.from_numpy(x)).detach().numpy()",
    "onnx": "import onnxruntime\n"
            "session = onnxruntime.InferenceSession(path)\n"
            "outputs = session.run(None, {session.get_inputs()[0].name: x})[0]",
    "keras": "import keras\n"
             "outputs = np.asarray(keras.saving.load_model(path)(x, training=False))",
    "savedmodel": "import tensorflow as tf\n"
                  "model = tf.saved_model.load(path)\n"
                  "outputs = model.serve(tf.constant(x)).numpy()",
}  # fmt: skip
SERVE = """
import sys
import numpy as np
path, folder = sys.argv[1], sys.argv[2]
x = np.load(folder + "/x.npy")
{loader}
assert not [m for m in sys.modules if m.startswith(("hvd_train", "horovod"))], "used hvd_train"
np.save(folder + "/outputs.npy", outputs)
"""
TOLERANCE = 1e-4  # against the float64 reference, relative to the largest output


def hvd_train(*arguments: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "hvd_train", *arguments]
    return subprocess.run(command, capture_output=True, text=True, timeout=600)


def serve(path: Path, loader: str, folder: Path) -> None:
    """Runs `path`'s model on folder/x.npy in a fresh process, into folder/outputs.npy."""
    script = SERVE.format(loader=loader)
    served = subprocess.run([sys.executable, "-c", script, str(path), str(folder)],
                            capture_output=True, text=True, timeout=300)  # fmt: skip
    assert served.returncode == 0, served.stderr


@pytest.fixture(scope="module")
def neutral_run(tmp_path_factory, mnist_dir):
    run = tmp_path_factory.mktemp("mnist_cnn-tensorflow")
    result = hvd_train("--framework", "tensorflow", "--epochs", "1", "--limit-steps", "20",
                       "--data-dir", str(mnist_dir), "--output-dir", str(run))  # fmt: skip
    assert result.returncode == 0, result.stderr
    return run


@pytest.mark.parametrize("format", LOADERS)
def test_an_export_serves_the_checkpoints_outputs_without_hvd_train(
    format, neutral_run, mnist_dir, tmp_path
):
    path = tmp_path / f"model{EXPORT_FORMATS[format][1]}"
    result = hvd_train("export", str(neutral_run), "--format", format, "--data-dir",
                       str(mnist_dir), "-o", str(path))  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert f"wrote {path} ({format}); loaded back" in result.stdout
    recipe = load_recipe("mnist_cnn")
    x, _ = take(load_data(recipe, mnist_dir).test, np.arange(100, 113))  # 13: not the 8 traced
    np.save(tmp_path / "x.npy", x)
    serve(path, LOADERS[format], tmp_path)
    newest = sorted((neutral_run / "checkpoints").iterdir())[-1]
    expected = reference_logits(recipe.layers, load_file(newest / "model.safetensors"), x)
    outputs = np.load(tmp_path / "outputs.npy")
    assert outputs.shape == (13, 10)
    assert np.abs(outputs - expected).max() <= TOLERANCE * np.abs(expected).max()


def test_exports_go_to_the_runs_export_folder_and_a_missing_checkpoint_is_one_line(neutral_run):
    result = hvd_train("export", str(neutral_run), "--format", "keras")
    assert result.returncode == 0, result.stderr
    newest = sorted((neutral_run / "checkpoints").iterdir())[-1]
    assert (neutral_run / "export" / f"{newest.name}.keras").is_file()
    result = hvd_train("export", str(neutral_run / "nowhere"), "--format", "onnx")
    assert result.returncode == 2
    assert "nowhere does not exist; check --checkpoint" in result.stderr.splitlines()[-1]


def test_a_torch_modules_recipe_exports_as_torch_and_refuses_keras(tmp_path):
    example = REPO / "recipes" / "examples" / "regression.py"
    result = hvd_train("--recipe", str(example), "--epochs", "1", "--output-dir", str(tmp_path))
    assert result.returncode == 0, result.stderr
    result = hvd_train("export", str(tmp_path), "--format", "keras")
    assert result.returncode == 2 and result.stderr.splitlines()[-1] == (
        "hvd-train: error: --format keras writes a tensorflow model, and the model of recipe "
        "'regression' is torch only; choose --format torch or onnx"
    )
    result = hvd_train("export", str(tmp_path), "--format", "torch", "-o", str(tmp_path / "m.pt2"))
    assert result.returncode == 0, result.stderr
    x = np.random.default_rng(1).normal(size=(5, 8)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    serve(tmp_path / "m.pt2", LOADERS["torch"], tmp_path)
    import torch

    model = load_example(example).model()
    newest = sorted((tmp_path / "checkpoints").iterdir())[-1]
    model.load_state_dict(load_torch_file(newest / "model.safetensors"))
    with torch.no_grad():
        expected = model(torch.from_numpy(x)).numpy()
    assert np.array_equal(np.load(tmp_path / "outputs.npy"), expected)


BRANCHING = """
import numpy as np
import torch
from torch import nn
from hvd_train import Recipe, Schedule

def data():
    x = np.random.default_rng(0).normal(size=(64, 4)).astype(np.float32)
    return (x, (x[:, 0] > 0).astype(np.int64)), (x, (x[:, 0] > 0).astype(np.int64))

class Branching(nn.Module):
    # A Python branch on a tensor's value: torch.export cannot capture it; TorchScript can.
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 2)

    def forward(self, x):
        if x.sum() > 0:
            return self.linear(x)
        return -self.linear(x)

recipe = Recipe(data=data, torch_model=Branching, schedule=Schedule(epochs=1, batch_size=16))
"""
TORCHSCRIPT = "import torch\noutputs = torch.jit.load(path)(torch.from_numpy(x)).detach().numpy()"


def test_a_model_torch_export_cannot_capture_is_compiled_by_torchscript_branches_and_all(
    tmp_path,
):
    (tmp_path / "branching.py").write_text(BRANCHING)
    result = hvd_train("--recipe", str(tmp_path / "branching.py"), "--output-dir",
                       str(tmp_path / "run"))  # fmt: skip
    assert result.returncode == 0, result.stderr
    result = hvd_train("export", str(tmp_path / "run"), "--format", "torch", "-o",
                       str(tmp_path / "model.pt2"))  # fmt: skip
    assert result.returncode == 0, result.stderr
    # One line says so; torch.export's own logs and graph dumps stay off the terminal.
    [line] = result.stderr.splitlines()
    assert line.startswith("hvd-train: torch.export cannot capture this model ("), line
    assert f"wrote {tmp_path}/model.pt (torch); loaded back" in result.stdout
    x = np.concatenate([np.ones((3, 4)), -np.ones((2, 4))]).astype(np.float32)
    outputs = {}
    for name, part in (("positive", x[:3]), ("negative", x[3:])):
        np.save(tmp_path / "x.npy", part)
        serve(tmp_path / "model.pt", TORCHSCRIPT, tmp_path)
        outputs[name] = np.load(tmp_path / "outputs.npy")
    newest = sorted((tmp_path / "run" / "checkpoints").iterdir())[-1]
    weights = load_file(newest / "model.safetensors")
    linear = x @ weights["linear.weight"].T + weights["linear.bias"]
    assert np.allclose(outputs["positive"], linear[:3], atol=1e-6)
    assert np.allclose(outputs["negative"], -linear[3:], atol=1e-6)  # the other branch


MIXED = """
import numpy as np
from torch import nn
from hvd_train import Recipe, Schedule

def data():
    x = np.random.default_rng(0).normal(size=(96, 8, 8, 3)).astype(np.float32)
    y = (x[:, :4, :, 0].mean(axis=(1, 2)) > 0).astype(np.int64)
    return (x[:64], y[:64]), (x[64:], y[64:])

def model():
    return nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Flatten(), nn.Linear(288, 2))

recipe = Recipe(data=data, torch_model=model,
                schedule=Schedule(epochs=1, batch_size=16, precision="bf16-mixed"))
"""


def test_a_bf16_mixed_model_exports_computing_in_bf16_and_as_onnx_in_fp32(tmp_path):
    """The torch program computes under autocast as training did; ONNX Runtime has no bf16
    convolution on CPU, so the ONNX graph computes in fp32. Each is checked against the
    checkpoint's fp32 weights run the same way, without hvd_train."""
    import torch

    (tmp_path / "mixed.py").write_text(MIXED)
    result = hvd_train("--recipe", str(tmp_path / "mixed.py"), "--output-dir",
                       str(tmp_path / "run"))  # fmt: skip
    assert result.returncode == 0, result.stderr
    x = np.random.default_rng(2).normal(size=(5, 8, 8, 3)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    namespace: dict = {}
    exec(MIXED, namespace)
    model = namespace["model"]().eval()
    newest = sorted((tmp_path / "run" / "checkpoints").iterdir())[-1]
    model.load_state_dict(load_torch_file(newest / "model.safetensors"))
    images = torch.from_numpy(x).permute(0, 3, 1, 2)
    with torch.no_grad(), torch.autocast("cpu", torch.bfloat16):
        bf16 = model(images).float().numpy()
    with torch.no_grad():
        fp32 = model(images).numpy()
    assert np.abs(bf16 - fp32).max() > 1e-4  # bf16 differs: the checks below tell them apart
    for format, expected in (("torch", bf16), ("onnx", fp32)):
        path = tmp_path / f"model{EXPORT_FORMATS[format][1]}"
        result = hvd_train("export", str(tmp_path / "run"), "--format", format, "-o", str(path))
        assert result.returncode == 0, result.stderr
        serve(path, LOADERS[format], tmp_path)
        assert np.allclose(np.load(tmp_path / "outputs.npy"), expected, rtol=0, atol=1e-5)


@pytest.mark.parametrize(
    ("output", "message"),
    [
        ("model.torch", "-o {d}/model.torch: --format torch writes a .pt2 file; name it "
                        "{d}/model.pt2"),
        ("missing/model.pt2", "-o {d}/missing/model.pt2: the folder {d}/missing does not "
                              "exist; create it"),
    ],
)  # fmt: skip
def test_an_output_its_loaders_cannot_take_is_one_line(output, message, tmp_path):
    result = hvd_train("export", str(tmp_path / "run"), "--format", "torch", "-o",
                       str(tmp_path / output))  # fmt: skip
    assert result.returncode == 2
    assert result.stderr.splitlines() == [f"hvd-train: error: {message.format(d=tmp_path)}"]
