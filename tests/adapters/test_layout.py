"""Both adapters against the framework-neutral weight layout and against each other."""

import functools
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from hvd_train.mnist import load_mnist
from hvd_train.recipe import load_recipe
from tests.conftest import FRAMEWORKS
from tests.reference import reference_logits

SHAPES = {
    "layer0.kernel": (5, 5, 1, 32),
    "layer0.bias": (32,),
    "layer3.kernel": (5, 5, 32, 64),
    "layer3.bias": (64,),
    "layer7.kernel": (1024, 128),
    "layer7.bias": (128,),
    "layer10.kernel": (128, 10),
    "layer10.bias": (10,),
}


@pytest.fixture(scope="module")
def weights(tmp_path_factory) -> tuple[Path, dict[str, np.ndarray]]:
    """Random weights in the neutral layout, scaled like a fan-in initialisation."""
    rng = np.random.default_rng(0)
    arrays = {
        name: (rng.standard_normal(shape) / np.sqrt(np.prod(shape[:-1]))).astype(np.float32)
        for name, shape in SHAPES.items()
    }
    path = tmp_path_factory.mktemp("weights") / "weights.safetensors"
    save_file(arrays, path)
    return path, arrays


@pytest.fixture(scope="module")
def run_probe(weights, mnist_dir, tmp_path_factory) -> Callable[[str], dict[str, np.ndarray]]:
    """probe.py's results for a framework, run once per framework for the module."""

    @functools.cache
    def run(framework: str) -> dict[str, np.ndarray]:
        out = tmp_path_factory.mktemp(framework) / "probe.npz"
        probe = Path(__file__).with_name("probe.py")
        command = [sys.executable, str(probe), framework, str(mnist_dir), str(weights[0]), str(out)]
        subprocess.run(command, check=True, timeout=300, capture_output=True)
        with np.load(out) as archive:
            return dict(archive)

    return run


@pytest.fixture(params=FRAMEWORKS)
def probed(request, run_probe) -> tuple[str, dict[str, np.ndarray]]:
    return request.param, run_probe(request.param)


def section(probe: dict, prefix: str) -> dict[str, np.ndarray]:
    return {k.removeprefix(prefix): v for k, v in probe.items() if k.startswith(prefix)}


def test_weights_round_trip_exactly_in_the_neutral_layout(probed, weights):
    _, probe = probed
    loaded = section(probe, "weights.")
    assert {name: array.shape for name, array in loaded.items()} == SHAPES
    assert sum(array.size for array in loaded.values()) == 184586
    for name, array in weights[1].items():
        assert np.array_equal(loaded[name], array), name


def test_logits_match_the_numpy_reference(probed, weights, mnist_dir):
    _, probe = probed
    images = load_mnist(mnist_dir).test_images[:32]
    expected = reference_logits(load_recipe("mnist_cnn"), weights[1], images)
    np.testing.assert_allclose(probe["logits"], expected, atol=1e-4, rtol=0)


def test_optimizer_state_round_trips_exactly(probed):
    _, probe = probed
    state, restored = section(probe, "optimizer."), section(probe, "restored.")
    assert state and state.keys() == restored.keys()
    assert any(np.any(array != 0) for array in state.values())
    for name, array in state.items():
        assert np.array_equal(restored[name], array), name


@pytest.mark.torch
@pytest.mark.tensorflow
def test_same_weights_give_the_same_logits_in_both_frameworks(run_probe):
    torch_probe, tensorflow_probe = run_probe("torch"), run_probe("tensorflow")
    assert section(torch_probe, "weights.").keys() == section(tensorflow_probe, "weights.").keys()
    np.testing.assert_allclose(torch_probe["logits"], tensorflow_probe["logits"], atol=1e-4, rtol=0)
