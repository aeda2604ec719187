"""ResNet-18 for 32x32 colour images (CIFAR's shape), in torch and in Keras: a model of the size
Horovod's users train (11.2 M parameters, 44.7 MB of fp32 gradients a step), for benchmarks.

    horovodrun -np 2 python -m hvd_train --recipe resnet18 [--framework tensorflow]

It trains on synthetic data of CIFAR-10's shape (each class a random image, plus noise), which
needs no files and which the network learns within an epoch. The model is the CIFAR variant of
He et al.'s ResNet-18: a 3x3 stem without pooling, four stages of two basic blocks (64, 128,
256 and 512 channels; each later stage halves the image), global average pooling, 10 logits.
The torch module and the Keras model have the same layers and parameters; their checkpoints
keep each framework's own layout.
"""

from __future__ import annotations

from typing import Any

from hvd_train import Data, Optimizer, Recipe, Schedule

STAGES = (64, 128, 256, 512)
BLOCKS_PER_STAGE = 2
CLASSES = 10


def torch_resnet18() -> Any:
    from torch import nn

    class BasicBlock(nn.Module):
        def __init__(self, inputs: int, channels: int, stride: int) -> None:
            super().__init__()
            self.body = nn.Sequential(
                nn.Conv2d(inputs, channels, 3, stride, padding=1, bias=False),
                nn.BatchNorm2d(channels),
                nn.ReLU(),
                nn.Conv2d(channels, channels, 3, padding=1, bias=False),
                nn.BatchNorm2d(channels),
            )
            self.shortcut = nn.Sequential()
            if stride != 1 or inputs != channels:
                self.shortcut = nn.Sequential(
                    nn.Conv2d(inputs, channels, 1, stride, bias=False), nn.BatchNorm2d(channels)
                )

        def forward(self, x: Any) -> Any:
            return (self.body(x) + self.shortcut(x)).relu()

    layers: list[nn.Module] = [
        nn.Conv2d(3, STAGES[0], 3, padding=1, bias=False),
        nn.BatchNorm2d(STAGES[0]),
        nn.ReLU(),
    ]
    inputs = STAGES[0]
    for stage, channels in enumerate(STAGES):
        for block in range(BLOCKS_PER_STAGE):
            stride = 2 if stage > 0 and block == 0 else 1
            layers.append(BasicBlock(inputs, channels, stride))
            inputs = channels
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(inputs, CLASSES)]
    return nn.Sequential(*layers)


def keras_resnet18() -> Any:
    import keras
    from keras import layers

    def normalized(x: Any) -> Any:  # torch's BatchNorm2d defaults, in Keras's terms
        return layers.BatchNormalization(momentum=0.9, epsilon=1e-5)(x)

    def basic_block(x: Any, channels: int, stride: int) -> Any:
        y = layers.Conv2D(channels, 3, stride, padding="same", use_bias=False)(x)
        y = layers.ReLU()(normalized(y))
        y = normalized(layers.Conv2D(channels, 3, padding="same", use_bias=False)(y))
        if stride != 1 or x.shape[-1] != channels:
            x = normalized(layers.Conv2D(channels, 1, stride, use_bias=False)(x))
        return layers.ReLU()(layers.Add()([x, y]))

    inputs = keras.Input((32, 32, 3))
    x = layers.Conv2D(STAGES[0], 3, padding="same", use_bias=False)(inputs)
    x = layers.ReLU()(normalized(x))
    for stage, channels in enumerate(STAGES):
        for block in range(BLOCKS_PER_STAGE):
            x = basic_block(x, channels, 2 if stage > 0 and block == 0 else 1)
    x = layers.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, layers.Dense(CLASSES)(x), name="resnet18")


recipe = Recipe(
    data=Data("synthetic", input_shape=(32, 32, 3), num_classes=CLASSES, train_samples=50000),
    torch_model=torch_resnet18,
    keras_model=keras_resnet18,
    optimizer=Optimizer(name="sgd", learning_rate=0.02, momentum=0.9, weight_decay=0.0005),
    schedule=Schedule(epochs=1, batch_size=32, warmup_epochs=0.1, decay="cosine"),
    description="ResNet-18 on synthetic data of CIFAR-10's shape: a model of real size",
)
