"""The optimizers' settings under each backend, in a process of its own: `weight_decay_exclude`
keeps biases and normalisation layers from weight decay, coupled (sgd) and decoupled (adamw),
and every other parameter takes it; rmsprop and sgd with Nesterov momentum take under Keras
the steps torch's own optimizers take; a Python recipe's own optimizer takes the schedule's
rate, in each parameter group's ratio, and its mistakes are one line."""

import json
import subprocess
import sys

import numpy as np
import pytest

from tests.conftest import FRAMEWORKS

pytestmark = pytest.mark.slow  # each test starts a backend in a process of its own

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
from hvd_train.data import take
from hvd_train.recipe import load_data
from hvd_train.recipe import load_recipe
from hvd_train.training.run import open_run

recipe = load_recipe(sys.argv[2])
batch = take(load_data(recipe, None).train, np.arange(32))
report, start_weights = {}, None
for name in ("sgd", "adamw"):
    weights = []
    for decay in (0.5, 0.0):  # each a new layer, set up once
        exclude = ["BIAS", "norm"] if decay else []  # (nothing reads it without a decay)
        dist = open_run(sys.argv[1], recipe.with_overrides({
            "name": name, "weight_decay": decay, "weight_decay_exclude": exclude}), 0).dist
        held = dist.exchange.state().weights
        start_weights = start_weights or {k: v.copy() for k, v in held.items()}
        dist.exchange.load_state(weights=start_weights)
        before = {k: v for k, v in dist.exchange.trained_state().items() if k.startswith("weight.")}
        dist.exchange.step([batch], 0.1, 0, np.zeros(2))
        weights.append((before, dist.exchange.trained_state()))
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


# Three steps of each optimizer as the backend makes it, from the same weights and gradients
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
        from hvd_train.distributed.torch.optimizers import _optimizer
        weight = torch.nn.Parameter(torch.from_numpy(start.copy()))
        optimizer = _optimizer(config, [weight], [True])
        for gradient in gradients:
            weight.grad = torch.from_numpy(gradient)
            optimizer.step()
        results.append(weight.detach().numpy().tolist())
    else:
        import keras
        from hvd_train.distributed.tensorflow.optimizers import _optimizer
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


# Whether each optimizer's steps change with momentum, the table's refusal bypassed: the
# optimizers READ_ONLY_WHEN says ignore it must step alike with and without it.
MOMENTUM = STEPS.replace(
    "config = Optimizer(**settings, learning_rate=0.01)",
    "config = Optimizer(name=settings['name'], learning_rate=0.01)\n"
    "    object.__setattr__(config, 'momentum', settings['momentum'])",
)


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_the_optimizers_that_read_momentum_are_those_the_table_names(framework):
    from hvd_train.recipe.settings import OPTIMIZERS, READ_ONLY_WHEN, Optimizer

    settings = [{"name": name, "momentum": m} for name in OPTIMIZERS for m in (0.0, 0.5)]
    steps = np.array(probe(MOMENTUM, framework, json.dumps(settings))[1:])
    reads = READ_ONLY_WHEN["Optimizer"]["momentum"].reads
    for name, (without, with_momentum) in zip(OPTIMIZERS, steps.reshape(4, 2, 4, 5), strict=True):
        assert (not np.array_equal(without, with_momentum)) == reads(Optimizer(name=name)), name


# A Python recipe's own optimizer, made by its function: one step through the backend at the
# schedule's rate 0.5, where the function's rate is 0.1 (the torch head's group: 0.01), against
# the framework's own step from the same weights at 0.5 (the head: 0.05); its state saved, and
# loaded into a new run's optimizer; a step under fp16-mixed (its loss scaled). Then the
# function's mistakes, each one line.
OWN = """
import copy, json, sys
import numpy as np
from hvd_train import Data, Recipe
from hvd_train.data import take
from hvd_train.recipe import load_data
from hvd_train.errors import UsageError
from hvd_train.training.run import open_run

DATA = Data("synthetic", input_shape=(8, 8, 1), num_classes=4, train_samples=64, test_samples=16)
framework = sys.argv[1]
if framework == "torch":
    import torch
    import torch.nn.functional as F

    def model():
        return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 8), torch.nn.ReLU(),
                                   torch.nn.Linear(8, 4))

    def groups(module, head_rate):
        return [{"params": list(module[1].parameters())},
                {"params": list(module[3].parameters()), "lr": head_rate}]

    def own(module):
        return torch.optim.SGD(groups(module, 0.01), lr=0.1, momentum=0.9)

    def wrong(module):
        return [own(module), "not an optimizer", torch.optim.SGD(module[1].parameters(), lr=0.1)]

    recipe = Recipe(data=DATA, torch_model=model, optimizer=own)
else:
    import keras
    import tensorflow as tf

    def model():
        return keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Flatten(),
                                 keras.layers.Dense(8, activation="relu"), keras.layers.Dense(4)])

    def own():
        return keras.optimizers.SGD(0.1, momentum=0.9)

    def wrong():
        decay = keras.optimizers.schedules.ExponentialDecay(0.1, 10, 0.5)
        return [own(), "not an optimizer", keras.optimizers.SGD(decay)]

    recipe = Recipe(data=DATA, keras_model=model, optimizer=own)

dist = open_run(framework, recipe, 0).dist
x, y = batch = take(load_data(recipe, None).train, np.arange(32))
if framework == "torch":
    reference = copy.deepcopy(dist.environment.backend.net.module)
    plain = torch.optim.SGD(groups(reference, 0.05), lr=0.5, momentum=0.9)
    loss = F.cross_entropy(reference(torch.from_numpy(x).permute(0, 3, 1, 2)), torch.from_numpy(y))
    loss.backward()
    plain.step()
    expected = [p.detach().numpy() for p in reference.parameters()]
    dist.exchange.step([batch], 0.5, 0, np.zeros(2))
    rates = [group["lr"] for group in dist.exchange.optimizer.param_groups]
    trained = [p.detach().numpy() for p in dist.environment.backend.net.module.parameters()]
else:
    reference = keras.models.clone_model(dist.exchange.model)
    reference.set_weights(dist.exchange.model.get_weights())
    plain = keras.optimizers.SGD(0.5, momentum=0.9)
    with tf.GradientTape() as tape:
        loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)(y, reference(x))
    plain.apply_gradients(zip(tape.gradient(loss, reference.trainable_variables),
                              reference.trainable_variables))
    expected = reference.get_weights()
    dist.exchange.step([batch], 0.5, 0, np.zeros(2))
    rates = [float(dist.exchange.optimizer.learning_rate.numpy())]
    trained = dist.exchange.model.get_weights()
differences = [float(np.abs(a - b).max()) for a, b in zip(trained, expected, strict=True)]
learning_rate = dist.learning_rate
state = dist.exchange.state().optimizer  # its momentum, into a new run's optimizer and back
dist = open_run(framework, recipe, 0).dist
dist.exchange.load_state(optimizer=state)
restored = dist.exchange.state().optimizer
same = sorted(restored) == sorted(state) and all(np.array_equal(state[k], restored[k])
                                                 for k in state)
dist = open_run(framework, recipe.with_overrides({"precision": "fp16-mixed"}), 0).dist
before = dist.exchange.state().weights
dist.exchange.step([batch], 0.5, 0, np.zeros(2))
moved = all(np.isfinite(v).all() for v in dist.exchange.state().weights.values()) and any(
    not np.array_equal(v, before[k]) for k, v in dist.exchange.state().weights.items())
errors = []
for made in (1, 2):
    def function(*arguments, made=made):
        return wrong(*arguments)[made]
    models = {"torch_model": model} if framework == "torch" else {"keras_model": model}
    try:
        open_run(framework, Recipe(data=DATA, optimizer=function, **models), 0)
        errors.append(None)
    except UsageError as error:
        errors.append(str(error))
print(json.dumps({"learning_rate": learning_rate, "rates": rates,
                  "difference": max(differences), "state": len(state), "restored": same,
                  "fp16_moved": moved, "errors": errors}))
"""


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_a_recipes_own_optimizer_takes_the_schedules_rate_in_each_groups_ratio(framework):
    report = probe(OWN, framework)
    assert report["learning_rate"] == pytest.approx(0.1)  # the one-process rate it scales
    assert report["rates"] == pytest.approx([0.5, 0.05] if framework == "torch" else [0.5])
    assert report["difference"] < 1e-6
    assert report["state"] >= 4 and report["restored"]  # a momentum for each parameter, at least
    assert report["fp16_moved"]
    if framework == "torch":
        assert report["errors"] == [
            "optimizer.function (function) returned str; under torch it must return a "
            "torch.optim.Optimizer over the module's parameters",
            "optimizer.function (function): its parameter groups hold 2 tensors (2 of the "
            "model's trainable ones), and the model has 4 trainable parameters; give each of "
            "them to one group, once",
        ]
    else:
        assert report["errors"] == [
            "optimizer.function (function) returned str; under TensorFlow it must return a "
            "Keras optimizer (keras.optimizers.Adam(...), ...), not wrapped: fp16-mixed wraps "
            "it itself",
            "optimizer.function (function): its optimizer has a learning rate schedule; give "
            "it a number, and the schedule to the recipe's Schedule(warmup_epochs=..., "
            "decay=...)",
        ]
