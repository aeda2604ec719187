import numpy as np
import pytest
import torch

from hvd_train.adapters import torch as torch_adapter
from hvd_train.recipe import load_recipe
from tests.reference import reference_logits

pytestmark = pytest.mark.torch


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return torch_adapter.build_model(load_recipe("mnist_cnn")).eval()


def neutral_weights(model) -> dict[str, np.ndarray]:
    return dict(torch_adapter.to_neutral(n, t) for n, t in model.state_dict().items())


def test_neutral_layout_names_and_shapes(model):
    shapes = {name: array.shape for name, array in neutral_weights(model).items()}
    assert shapes == {
        "layer0.kernel": (5, 5, 1, 32),
        "layer0.bias": (32,),
        "layer3.kernel": (5, 5, 32, 64),
        "layer3.bias": (64,),
        "layer7.kernel": (1024, 128),
        "layer7.bias": (128,),
        "layer10.kernel": (128, 10),
        "layer10.bias": (10,),
    }
    assert sum(p.numel() for p in model.parameters()) == 184586


def test_neutral_round_trip_is_exact(model):
    weights = neutral_weights(model)
    restored = dict(torch_adapter.from_neutral(n, a) for n, a in weights.items())
    for name, tensor in model.state_dict().items():
        assert torch.equal(restored[name], tensor)


def test_logits_match_the_numpy_reference_of_the_neutral_layout(model, mnist_dir):
    from hvd_train.mnist import load_mnist

    images = load_mnist(mnist_dir).test_images[:16]
    with torch.no_grad():
        logits = model(torch.from_numpy(images).permute(0, 3, 1, 2)).numpy()
    expected = reference_logits(load_recipe("mnist_cnn"), neutral_weights(model), images)
    np.testing.assert_allclose(logits, expected, atol=1e-4)
