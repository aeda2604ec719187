"""Runs in its own process (pytest must not load a Horovod binding): the torch backend's module
is in the mode each pass asks for, though the backend sets it only when it changes. Prints OK,
or fails.
"""

import torch
from torch import nn

from hvd_train.distributed.torch.export import Served
from hvd_train.distributed.torch.modules import TorchModule


class Frozen(nn.Module):
    """A module that puts a part of itself in evaluation mode as it is made."""

    def __init__(self) -> None:
        super().__init__()
        self.dropout = nn.Dropout(0.5)
        self.dense = nn.Linear(4, 2)
        self.dropout.eval()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dense(self.dropout(x))


def modes(module: nn.Module) -> set[bool]:
    return {m.training for m in module.modules()}


if __name__ == "__main__":
    net = TorchModule(Frozen())
    x = torch.ones(3, 4)
    net.forward(x, training=True)  # the whole module trains, as when every pass set the mode
    assert modes(net.module) == {True}, "the first training pass left a part in eval mode"
    net.forward(x, training=False)
    assert modes(net.module) == {False}
    net.forward(x, training=True)
    assert modes(net.module) == {True}
    Served(net.module, channels_first=True).eval()  # as export does, behind the backend's back
    net.forward(x, training=True)
    assert modes(net.module) == {True}, "a pass after export trained in eval mode"
    print("OK")
