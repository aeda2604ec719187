"""Both adapters against the framework-neutral layout and against each other, for every layer
type: the same weights give the NumPy reference's logits (within 1e-4) in both frameworks."""

import functools
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from hvd_train.data import take
from hvd_train.recipe import load_data, load_recipe
from hvd_train.recipe.layers import neutral_weight_shapes, trainable_parameter_count
from tests.conftest import FRAMEWORKS
from tests.horovodrun import script
from tests.reference import reference_logits

# Each test starts a backend in a process of its own: make test runs them, test-quick not.
pytestmark = pytest.mark.slow

# mnist_cnn's layout, written out: the neutral layout is a contract, not whatever the code says.
MNIST_CNN_SHAPES = {
    "layer0.kernel": (5, 5, 1, 32),
    "layer0.bias": (32,),
    "layer3.kernel": (5, 5, 32, 64),
    "layer3.bias": (64,),
    "layer7.kernel": (1024, 128),
    "layer7.bias": (128,),
    "layer10.kernel": (128, 10),
    "layer10.bias": (10,),
}
RECIPES = ["mnist_cnn", "mnist_bn", script("zoo.toml"), script("zoo_valid.toml")]


@pytest.fixture(scope="module", params=RECIPES, ids=lambda r: Path(r).stem)
def recipe(request):
    return load_recipe(request.param), request.param


def random_weights(recipe, path: Path) -> dict[str, np.ndarray]:
    """Random weights in the neutral layout, scaled like a fan-in initialisation; batchnorm's
    statistics and scales away from their defaults, so a mix-up of the four shows."""
    rng = np.random.default_rng(0)
    arrays = {}
    for name, shape in neutral_weight_shapes(recipe.layers, recipe.data.input_shape).items():
        values = rng.standard_normal(shape) / np.sqrt(np.prod(shape[:-1]) or 1)
        if name.endswith(("moving_variance", "gamma")):
            values = 0.5 + np.abs(rng.standard_normal(shape))
        arrays[name] = values.astype(np.float32)
    save_file(arrays, path)
    return arrays


@pytest.fixture(scope="module")
def probes(mnist_dir, tmp_path_factory) -> Callable[[str], dict[str, tuple[dict, dict]]]:
    """probe.py's results for a framework, every recipe in one process (once per framework),
    with the weights each recipe's probe loaded, by recipe."""
    directory = tmp_path_factory.mktemp("probe")
    weights = {reference: random_weights(load_recipe(reference), directory / f"{number}.st")
               for number, reference in enumerate(RECIPES)}  # fmt: skip

    @functools.cache
    def run(framework: str) -> dict[str, tuple[dict, dict]]:
        cases = [(reference, directory / f"{number}.st", directory / f"{number}-{framework}.npz")
                 for number, reference in enumerate(RECIPES)]  # fmt: skip
        command = [sys.executable, script("probe.py"), framework, str(mnist_dir),
                   *(str(part) for case in cases for part in case)]  # fmt: skip
        subprocess.run(command, check=True, timeout=600, capture_output=True)
        found = {}
        for reference, _, out in cases:
            with np.load(out) as archive:
                found[reference] = (dict(archive), weights[reference])
        return found

    return run


@pytest.fixture(scope="module")
def run_probe(recipe, probes) -> Callable[[str], tuple[dict, dict]]:
    """probe.py's results for this module's recipe under a framework, and its weights."""
    return lambda framework: probes(framework)[recipe[1]]


@pytest.fixture(params=FRAMEWORKS)
def probed(request, run_probe):
    return request.param, *run_probe(request.param)


def section(probe: dict, prefix: str) -> dict[str, np.ndarray]:
    return {k.removeprefix(prefix): v for k, v in probe.items() if k.startswith(prefix)}


def test_mnist_cnn_layout_is_the_documented_one():
    recipe = load_recipe("mnist_cnn")
    assert neutral_weight_shapes(recipe.layers, recipe.data.input_shape) == MNIST_CNN_SHAPES
    assert trainable_parameter_count(recipe.layers, recipe.data.input_shape) == 184586


def test_weights_round_trip_exactly_in_the_neutral_layout(probed, recipe):
    _, probe, weights = probed
    loaded = section(probe, "weights.")
    assert loaded.keys() == weights.keys()
    for name, array in weights.items():
        assert np.array_equal(loaded[name], array), name
    count = trainable_parameter_count(recipe[0].layers, recipe[0].data.input_shape)
    assert int(probe["trained_parameters"]) == count


def test_logits_match_the_numpy_reference(probed, recipe, mnist_dir):
    _, probe, weights = probed
    images, _ = take(load_data(recipe[0], mnist_dir).test, np.arange(32))
    expected = reference_logits(recipe[0].layers, weights, images)
    assert np.abs(expected).max() > 0.1  # the comparison is not between near-zeros
    np.testing.assert_allclose(probe["logits"], expected, atol=1e-4, rtol=0)


def test_optimizer_state_round_trips_exactly(probed):
    _, probe, _ = probed
    state, restored = section(probe, "optimizer."), section(probe, "restored.")
    assert state and state.keys() == restored.keys()
    assert any(np.any(array != 0) for array in state.values())
    for name, array in state.items():
        assert np.array_equal(restored[name], array), name


@pytest.mark.torch
@pytest.mark.tensorflow
def test_same_weights_give_the_same_logits_in_both_frameworks(run_probe):
    (torch_probe, _), (tensorflow_probe, _) = run_probe("torch"), run_probe("tensorflow")
    assert section(torch_probe, "weights.").keys() == section(tensorflow_probe, "weights.").keys()
    np.testing.assert_allclose(torch_probe["logits"], tensorflow_probe["logits"], atol=1e-4, rtol=0)


@pytest.mark.torch
@pytest.mark.tensorflow
def test_batchnorm_statistics_move_alike_in_both_frameworks(run_probe):
    (torch_probe, weights), (tensorflow_probe, _) = run_probe("torch"), run_probe("tensorflow")
    moved = section(torch_probe, "stepped."), section(tensorflow_probe, "stepped.")
    statistics = [name for name in weights if name.endswith(("moving_mean", "moving_variance"))]
    for name in statistics:
        assert not np.allclose(moved[0][name], weights[name]), f"{name} did not move"
        # torch's running variance takes the unbiased batch variance, Keras's the biased one:
        # they differ by n / (n - 1), 1.6% for a dense layer's batch of 64.
        np.testing.assert_allclose(moved[0][name], moved[1][name], rtol=0.02, atol=1e-5)
