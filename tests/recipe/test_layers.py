import pytest

from hvd_train.errors import UsageError
from hvd_train.recipe.layers import Layer, checked_layer, output_shape, same_padding


@pytest.mark.parametrize(
    ("size", "kernel", "stride", "padding"),
    # TensorFlow's rule: output ceil(size / stride); an odd total pads one more at the end.
    [(28, 3, 1, (1, 1)), (28, 4, 1, (1, 2)), (28, 3, 2, (0, 1)), (13, 4, 2, (1, 2)),
     (7, 2, 3, (0, 1)), (6, 2, 3, (0, 0)), (5, 1, 1, (0, 0))],
)  # fmt: skip
def test_same_padding_follows_tensorflow(size, kernel, stride, padding):
    assert same_padding(size, kernel, stride) == padding


@pytest.mark.parametrize(
    ("layer", "shape", "out"),
    [
        (dict(type="conv2d", filters=8, kernel_size=3, stride=2), (13, 11, 3), (6, 5, 8)),
        (dict(type="conv2d", filters=8, kernel_size=3, stride=2, padding="same"), (13, 11, 3),
         (7, 6, 8)),
        (dict(type="avgpool2d", pool_size=2), (7, 6, 4), (3, 3, 4)),
        (dict(type="global_avgpool"), (7, 6, 4), (4,)),
        (dict(type="flatten"), (7, 6, 4), (168,)),
        (dict(type="batchnorm"), (12,), (12,)),
    ],
)  # fmt: skip
def test_output_shapes(layer, shape, out):
    assert output_shape(checked_layer(layer, "x"), shape) == out


def test_a_python_layer_gets_its_defaults_checked():
    layer = checked_layer(Layer("batchnorm", {"momentum": 0.5}), "model.layers[2]")
    assert layer.params == {"momentum": 0.5, "epsilon": 1e-5}
    with pytest.raises(UsageError, match=r"model.layers\[2\].momentum: 1.0 is out of range"):
        checked_layer(Layer("batchnorm", {"momentum": 1.0}), "model.layers[2]")
