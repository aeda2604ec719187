"""The user's own arrays: one `.npz` file holding `x_train`, `y_train`, `x_test`, `y_test`, as
Keras's `load_data` names them.

Images are N x H x W x C (N x H x W when there is one channel), uint8 (scaled to [0, 1]) or
float (taken as they are, and must be finite); labels are integers in [0, num_classes). Each
is checked against the recipe's `[data]` table, and each mistake is one line naming the key and
the fix.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np

from hvd_train.data.base import ArrayDataset, SourceTable, Splits
from hvd_train.errors import UsageError

KEYS = ("x_train", "y_train", "x_test", "y_test")


def _read(path: Path) -> dict[str, np.ndarray]:
    try:
        archive = np.load(path, allow_pickle=False)
        if not isinstance(archive, np.lib.npyio.NpzFile):
            raise UsageError(f"{path} is a single .npy array, not an .npz archive; save the "
                             f"arrays with np.savez(path, {'=..., '.join(KEYS)}=...)")  # fmt: skip
        with archive:
            missing = [key for key in KEYS if key not in archive.files]
            if missing:
                raise UsageError(
                    f"{path} lacks {', '.join(missing)}; save the arrays under the names "
                    f"{', '.join(KEYS)}"
                )
            return {key: archive[key] for key in KEYS}
    except FileNotFoundError:
        raise UsageError(f"data.path: {path} does not exist; fix the path (it is relative to "
                         "the recipe file)") from None  # fmt: skip
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as error:
        raise UsageError(
            f"{path} is not a readable .npz archive ({error}); write it with np.savez"
        ) from None


def _images(path: Path, key: str, array: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    if array.ndim == 3 and shape[2] == 1:
        array = array[..., np.newaxis]
    if array.shape[1:] != shape:
        raise UsageError(
            f"{path}: {key} has images of shape {list(array.shape[1:])}, but data.input_shape "
            f"is {list(shape)}; fix one of them (images are N x height x width x channels)"
        )
    if array.dtype == np.uint8:
        return array.astype(np.float32) / 255.0
    if array.dtype.kind != "f":
        raise UsageError(
            f"{path}: {key} is {array.dtype}; store images as uint8 (0-255) or as floats"
        )
    array = array.astype(np.float32)
    if not np.isfinite(array).all():
        raise UsageError(f"{path}: {key} holds NaN or infinite values; clean the data")
    return array


def _labels(path: Path, key: str, array: np.ndarray, images: int, classes: int) -> np.ndarray:
    if array.ndim == 2 and array.shape[1] == 1:  # (N, 1), as CIFAR's load_data gives them
        array = array[:, 0]
    if array.ndim != 1 or array.dtype.kind not in "iu":
        raise UsageError(
            f"{path}: {key} must be one integer class label per image, got {array.dtype} "
            f"of shape {list(array.shape)}"
        )
    if len(array) != images:
        raise UsageError(
            f"{path}: {key} has {len(array)} labels for {images} images; they must match"
        )
    if len(array) and (array.min() < 0 or array.max() >= classes):
        raise UsageError(
            f"{path}: {key} has labels from {array.min()} to {array.max()}, outside 0 to "
            f"{classes - 1}; fix the labels or data.num_classes"
        )
    return array.astype(np.int64)


def load_npz(data: SourceTable) -> Splits:
    """The arrays of `data.path`, checked against `data`."""
    assert data.path is not None and data.input_shape and data.num_classes
    path = Path(data.path)
    arrays = _read(path)
    splits = []
    for part in ("train", "test"):
        images = _images(path, f"x_{part}", arrays[f"x_{part}"], data.input_shape)
        if not len(images):
            raise UsageError(f"{path}: x_{part} is empty; it needs at least one image")
        labels = _labels(path, f"y_{part}", arrays[f"y_{part}"], len(images), data.num_classes)
        splits.append(ArrayDataset(images, labels))
    return Splits(train=splits[0], test=splits[1])
