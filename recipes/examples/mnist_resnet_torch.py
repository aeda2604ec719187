"""A small residual network for MNIST, written as a plain torch module: a Python recipe.

    horovodrun -np 2 python -m hvd_train --recipe recipes/examples/mnist_resnet_torch.py

hvd_train hands the module images as torch's (N, C, H, W) and trains it, averaging the
gradients over the ranks with Horovod; everything else (sharding, checkpoints, resume, elastic,
eval) is the same as for a TOML recipe. A torch module trains under --framework torch only.
The optimizer is torch's own, made by `optimizer` below with two parameter groups; hvd_train
scales its learning rate with the world size, warms it up and decays it by the Schedule.
"""

import torch
from torch import nn

from hvd_train import Data, Recipe, Schedule


class ResidualBlock(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(channels, channels, 3, padding=1, bias=False),
            nn.BatchNorm2d(channels),
            nn.ReLU(),
            nn.Conv2d(channels, channels, 3, padding=1, bias=False),
            nn.BatchNorm2d(channels),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x + self.body(x))


def resnet() -> nn.Module:
    """28x28 -> 14x14 (16 channels) -> 7x7 (32 channels) -> 10 logits."""
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1, bias=False),
        nn.BatchNorm2d(16),
        nn.ReLU(),
        nn.MaxPool2d(2),
        ResidualBlock(16),
        nn.Conv2d(16, 32, 3, stride=2, padding=1, bias=False),
        nn.BatchNorm2d(32),
        nn.ReLU(),
        ResidualBlock(32),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(32, 10),
    )


def optimizer(model: nn.Module) -> torch.optim.Optimizer:
    """AdamW, with weight decay on the convolutions' and the dense layer's weights only: not on
    biases and batchnorm's scales and shifts (the one-dimensional parameters)."""
    weights = [p for p in model.parameters() if p.ndim > 1]
    others = [p for p in model.parameters() if p.ndim == 1]
    groups = [{"params": weights, "weight_decay": 0.0001}, {"params": others, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=0.002)


recipe = Recipe(
    data=Data("mnist"),
    torch_model=resnet,
    optimizer=optimizer,
    schedule=Schedule(epochs=1, batch_size=64, warmup_epochs=0.1, decay="cosine"),
)
