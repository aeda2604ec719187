"""Runs in its own process (pytest must not load a Horovod binding): the torch exchange's flat
buffer, alone. Each parameter's .grad is a view of it, in the parameter's own layout, and the
backward passes accumulate into it exactly what autograd computes. Prints OK, or fails.
"""

import torch
from torch import nn

from hvd_train.distributed.torch.exchange import FlatExchange
from hvd_train.errors import UsageError

CPU = torch.device("cpu")


def model() -> nn.Module:
    torch.manual_seed(0)
    convolutions = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Conv2d(8, 4, 3), nn.Flatten())
    return nn.Sequential(convolutions, nn.Linear(4 * 4 * 4, 5))


def gradients_are_views_of_one_buffer_in_the_parameters_layout(layout) -> None:
    net = model().to(memory_format=layout)
    parameters = list(net.parameters())
    exchange = FlatExchange(parameters, None, CPU, passes=2, overlap=False, exchanges=False)
    x = torch.randn(6, 3, 8, 8).to(memory_format=layout)
    y = torch.randint(0, 5, (6,))
    expected = torch.autograd.grad(nn.functional.cross_entropy(net(x), y), parameters)
    for _ in range(2):  # two passes add up, as backward_passes_per_step's do
        nn.functional.cross_entropy(net(x), y).backward()
    flat = exchange.flat
    assert flat.numel() - len(exchange.control) == sum(p.numel() for p in parameters)
    for parameter, gradient in zip(parameters, expected, strict=True):
        assert parameter.grad.untyped_storage().data_ptr() == flat.untyped_storage().data_ptr()
        assert parameter.grad.stride() == parameter.stride()
        torch.testing.assert_close(parameter.grad, 2 * gradient, rtol=1e-6, atol=1e-7)
    # `gradients`, whose norm the backend reports, holds every .grad and no control value.
    exchange.control.fill_(1e3)
    every = nn.utils.get_total_norm([p.grad for p in parameters])
    torch.testing.assert_close(torch.linalg.vector_norm(exchange.gradients), every)
    exchange.clear()
    assert not flat.any()
    assert all(p.grad is v for p, v in zip(parameters, exchange.views, strict=True))


def a_gradient_set_elsewhere_goes_back_into_the_buffer_when_cleared() -> None:
    parameters = list(model().parameters())
    exchange = FlatExchange(parameters, None, CPU, passes=1, overlap=False, exchanges=False)
    parameters[0].grad = None
    parameters[1].grad = torch.ones_like(parameters[1])
    exchange.clear()
    assert parameters[0].grad is exchange.views[0] and parameters[1].grad is exchange.views[1]


def a_pass_past_the_steps_last_is_refused_unless_its_gradients_were_zeroed() -> None:
    net = model()
    exchange = FlatExchange(list(net.parameters()), None, CPU, passes=1, overlap=False,
                            exchanges=False)  # fmt: skip
    x, y = torch.randn(2, 3, 8, 8), torch.tensor([0, 1])
    nn.functional.cross_entropy(net(x), y).backward()
    exchange.clear()  # optimizer.zero_grad(): the pass is not one of the step's
    nn.functional.cross_entropy(net(x), y).backward()
    try:
        nn.functional.cross_entropy(net(x), y).backward()
    except UsageError as error:
        assert "backward: pass 2 of a step that takes 1" in str(error)
    else:
        raise AssertionError("a second pass in a step of one was taken")


def parameters_of_several_dtypes_are_refused_by_name() -> None:
    parameters = [nn.Parameter(torch.zeros(3)), nn.Parameter(torch.zeros(3, dtype=torch.float64))]
    try:
        FlatExchange(parameters, None, CPU, passes=1, overlap=False, exchanges=False)
    except UsageError as error:
        assert "several dtypes (float32, float64)" in str(error) and "module.float()" in str(error)
    else:
        raise AssertionError("parameters of two dtypes were taken")


if __name__ == "__main__":
    for layout in (torch.contiguous_format, torch.channels_last):
        gradients_are_views_of_one_buffer_in_the_parameters_layout(layout)
    a_gradient_set_elsewhere_goes_back_into_the_buffer_when_cleared()
    a_pass_past_the_steps_last_is_refused_unless_its_gradients_were_zeroed()
    parameters_of_several_dtypes_are_refused_by_name()
    print("OK")
