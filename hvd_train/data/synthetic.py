"""Synthetic data, generated on the fly: no files, the same on every rank and every run.

Each class has a fixed random prototype image; example i is its class's prototype plus noise,
both derived from i alone (a counter-based hash), so any batch is made directly from its
indices. A model can learn it to nearly 100%, so it serves both benchmarks and tests.
"""

from __future__ import annotations

import math

import numpy as np

from hvd_train.data.base import SourceTable, Splits

TEST_OFFSET = 1 << 40  # test examples are numbered after every possible training example
NOISE_SCALE = math.sqrt(3.0)  # uniform noise in [-sqrt 3, sqrt 3): variance 1


def _mix(x: np.ndarray) -> np.ndarray:
    """SplitMix64: well-spread 64-bit values from consecutive integers."""
    x = x + np.uint64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


class SyntheticDataset:
    def __init__(self, size: int, offset: int, shape: tuple[int, ...], classes: int) -> None:
        self.size, self.offset, self.classes = size, offset, classes
        self.prototypes = np.random.default_rng(0).standard_normal((classes, *shape), np.float32)

    def __len__(self) -> int:
        return self.size

    def labels(self, indices: np.ndarray) -> np.ndarray:
        keys = np.asarray(indices, np.uint64) + np.uint64(self.offset)
        return (_mix(keys) % np.uint64(self.classes)).astype(np.int64)

    def __getitem__(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        labels = self.labels(indices)
        pixels = math.prod(self.prototypes.shape[1:])
        keys = (np.asarray(indices, np.uint64) + np.uint64(self.offset))[:, None]
        counters = keys * np.uint64(pixels) + np.arange(pixels, dtype=np.uint64)
        uniform = (_mix(counters) >> np.uint64(40)).astype(np.float32) / float(1 << 24)
        noise = (2 * uniform - 1) * NOISE_SCALE
        images = self.prototypes[labels] + noise.reshape(len(labels), *self.prototypes.shape[1:])
        return images, labels


def load_synthetic(data: SourceTable) -> Splits:
    assert data.train_samples and data.test_samples and data.input_shape and data.num_classes
    return Splits(
        train=SyntheticDataset(data.train_samples, 0, data.input_shape, data.num_classes),
        test=SyntheticDataset(data.test_samples, TEST_OFFSET, data.input_shape, data.num_classes),
    )
