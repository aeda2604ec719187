"""The optimizers' settings under each adapter, in a process of its own: `weight_decay_exclude`
keeps biases and normalisation layers from weight decay, coupled (sgd) and decoupled (adamw),
and every other parameter takes it; rmsprop and sgd with Nesterov momentum take under Keras
the steps torch's own optimizers take."""

import json
import subprocess
import sys

import numpy as np
import pytest

from tests.conftest import FRAMEWORKS

pytestmark = pytest.mark.slow  # each test starts an adapter in a process of its own

# A convolution, a batchnorm and a dense layer: two kernels, two biases, gamma and beta.
RECIPE = """
[data]
dataset = "synthetic"
input_shape = [8, 8, 1]
num_classes = 4
train_samples = 64
test_samples = 16

[model]
layers = [
  { type = "conv2d", filters = 3, kernel_size = 3 }, { type = "batchnorm" }, { type = "relu" },
  { type = "flatten" }, { type = "dense", units = 4 }, { type = "softmax" },
]
"""

# One step from the same weights with weight decay 0.5 and without: a parameter the decay skips
# ends exactly where the plain step put it, one it reaches ends lr x 0.5 x its weight lower
# (sgd's L2 term, at a rate of 0.1, as adamw's decoupled decay).
EXCLUSION = """
import json, sys
import numpy as np
from hvd_train.data import load_data, take
from hvd_train.recipe import load_recipe
from hvd_train.run import open_run, start

recipe = load_recipe(sys.argv[2])
adapter = start(sys.argv[1], recipe)
batch = take(load_data(recipe, None).train, np.arange(32))
report, start_weights = {}, None
for name in ("sgd", "adamw"):
    weights = []
    for decay in (0.5, 0.0):
        open_run(adapter, recipe.with_overrides({
            "name": name, "weight_decay": decay, "weight_decay_exclude": ["BIAS", "norm"]}), 0)
        start_weights = start_weights or {k: v.copy() for k, v in adapter.weights().items()}
        adapter.load_weights(start_weights)
        state = adapter.trained_state  # torch's arrays are views of the parameters: copied
        before = {k: v.copy() for k, v in state().items() if k.startswith("weight.")}
        adapter.train_step([batch], 0.1, 0, np.zeros(2))
        weights.append((before, {k: v.copy() for k, v in state().items()}))
    (before, decayed), (_, plain) = weights
    kinds = []
    for key, start_value in before.items():
        change = decayed[key] - plain[key]
        if np.array_equal(decayed[key], plain[key]):
            kinds.append("kept")
        elif np.allclose(change, -0.1 * 0.5 * start_value, rtol=1e-4, atol=1e-6):
            kinds.append("decayed")
        else:
            kinds.append("neither")
    report[name] = sorted(kinds)
print(json.dumps(report))
"""


def probe(code: str, *arguments: str) -> dict:
    result = subprocess.run([sys.executable, "-c", code, *arguments], capture_output=True,
                            text=True, timeout=300)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.splitlines()[-1])


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_weight_decay_exclude_keeps_biases_and_norms_from_the_decay(framework, tmp_path):
    (tmp_path / "small.toml").write_text(RECIPE)
    report = probe(EXCLUSION, framework, str(tmp_path / "small.toml"))
    # The two biases, gamma and beta are kept; the two kernels decayed.
    expected = ["decayed"] * 2 + ["kept"] * 4
    assert report == {"sgd": expected, "adamw": expected}


# Three steps of each optimizer as the adapter makes it, from the same weights and gradients
# (standard normal: none near 0, where RMSprop's epsilon and the rounding would dominate).
STEPS = """
import json, sys
import numpy as np
from hvd_train.recipe.settings import Optimizer

rng = np.random.default_rng(0)
start = rng.standard_normal((4, 5)).astype(np.float32)
gradients = rng.standard_normal((3, 4, 5)).astype(np.float32)
results = [start.tolist()]
for settings in json.loads(sys.argv[2]):
    config = Optimizer(**settings, learning_rate=0.01)
    if sys.argv[1] == "torch":
        import torch
        from hvd_train.adapters.torch import _optimizer
        weight = torch.nn.Parameter(torch.from_numpy(start.copy()))
        optimizer = _optimizer(config, [weight], [True])
        for gradient in gradients:
            weight.grad = torch.from_numpy(gradient)
            optimizer.step()
        results.append(weight.detach().numpy().tolist())
    else:
        import keras
        from hvd_train.adapters.tensorflow import _optimizer
        weight = keras.Variable(start)
        optimizer = _optimizer(config)
        for gradient in gradients:
            optimizer.apply_gradients([(keras.ops.convert_to_tensor(gradient), weight)])
        results.append(keras.ops.convert_to_numpy(weight).tolist())
print(json.dumps(results))
"""
SETTINGS = [
    {"name": "rmsprop"},
    {"name": "rmsprop", "momentum": 0.5},
    {"name": "sgd", "momentum": 0.9, "nesterov": True},
]


@pytest.mark.torch
@pytest.mark.tensorflow
def test_rmsprop_and_nesterov_take_torchs_steps_under_keras():
    steps = {framework: probe(STEPS, framework, json.dumps(SETTINGS))
             for framework in ("torch", "tensorflow")}  # fmt: skip
    start, *torch_steps = (np.array(s) for s in steps["torch"])
    keras_steps = steps["tensorflow"][1:]
    for settings, torch_step, keras_step in zip(SETTINGS, torch_steps, keras_steps, strict=True):
        assert np.abs(torch_step - start).min() > 1e-3, settings  # every weight moved
        np.testing.assert_allclose(keras_step, torch_step, rtol=1e-5, atol=1e-6,
                                   err_msg=str(settings))  # fmt: skip
