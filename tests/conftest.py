import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def mnist_dir() -> Path:
    """Real MNIST: $HVD_TRAIN_TEST_MNIST, else ../shared/data/mnist, else the user's cache."""
    for candidate in (os.environ.get("HVD_TRAIN_TEST_MNIST"), REPO.parent / "shared/data/mnist"):
        if candidate and Path(candidate).is_dir():
            return Path(candidate)
    from hvd_train.mnist import fetch_into_cache

    return fetch_into_cache()
