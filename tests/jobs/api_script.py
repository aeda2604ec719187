"""A user's script with a recipe made in code: in-memory arrays and a small model for each
framework. usage: api_script.py train|launch FRAMEWORK OUTPUT_DIR

`train` runs inside a job (under horovodrun); `launch` starts two ranks itself with
hvd_train.launch, as a notebook would. Prints rank 0's summary as `SUMMARY {...}`.
"""

import json
import sys

import numpy as np

import hvd_train


def corner_squares():
    """Four classes: a bright square in one corner of a 12x12 image, on noise."""
    rng = np.random.default_rng(1)
    parts = []
    for count in (2000, 400):
        labels = rng.integers(0, 4, count)
        images = rng.uniform(0, 0.3, (count, 12, 12, 1)).astype(np.float32)
        for label, (row, col) in enumerate([(1, 1), (1, 7), (7, 1), (7, 7)]):
            images[labels == label, row : row + 4, col : col + 4] += 0.6
        parts.append((images, labels))
    return tuple(parts)


def torch_mlp():
    from torch import nn

    return nn.Sequential(nn.Flatten(), nn.Linear(144, 32), nn.ReLU(), nn.Linear(32, 4))


def keras_mlp():
    import keras

    layers = keras.layers
    return keras.Sequential(
        [keras.Input((12, 12, 1)), layers.Flatten(), layers.Dense(32, "relu"), layers.Dense(4)]
    )


recipe = hvd_train.Recipe(
    data=corner_squares,
    torch_model=torch_mlp,
    keras_model=keras_mlp,
    optimizer=hvd_train.Optimizer(learning_rate=0.003),
    schedule=hvd_train.Schedule(epochs=2, batch_size=32),
)

if __name__ == "__main__":
    mode, framework, output_dir = sys.argv[1:4]
    start = hvd_train.launch if mode == "launch" else hvd_train.train
    options = {"np": 2} if mode == "launch" else {}
    summary = start(recipe, framework=framework, output_dir=output_dir, log_every=20, **options)
    if summary["world_size"] == 2 and mode == "train":
        import os

        if os.environ.get("HOROVOD_RANK") != "0":
            sys.exit(0)
    print("SUMMARY " + json.dumps(summary))
