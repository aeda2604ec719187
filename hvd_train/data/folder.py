"""Images in class folders, as ImageNet, torchvision's `ImageFolder` and Keras's
`image_dataset_from_directory` lay them out: `path/train/<class>/*.png|jpg` and
`path/test/<class>/*`. The classes sorted by name give the labels. Only the file names are held;
each image is read and decoded (OpenCV) when a batch asks for it, so memory does not grow with
the number of images.

Images become `input_shape` (height, width, channels): 1 channel is greyscale, 3 is RGB; with
`resize = true` every image is resized to it, otherwise an image of another size is a mistake.
Pixels are scaled to [0, 1]. A file that is not a readable image is named, with its example's
index, when its batch is read.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from hvd_train.data.base import SourceTable, Splits
from hvd_train.errors import UsageError

SUFFIXES = (".png", ".jpg", ".jpeg")


@dataclass(frozen=True)
class ImageFolder:
    """One split: its files (as bytes, to keep them compact) and their labels."""

    files: np.ndarray  # dtype S: paths
    labels: np.ndarray  # int64
    shape: tuple[int, int, int]
    resize: bool

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        paths = [self.files[index].decode() for index in indices]
        x = decode_images(paths, lambda i: f"{paths[i]} (example {indices[i]})", self.shape,
                          self.resize, "replace or remove it")  # fmt: skip
        return x, self.labels[indices]


def decode_images(
    sources: Sequence[str | bytes],
    where: Callable[[int], str],
    shape: tuple[int, int, int],
    resize: bool,
    fix: str,
) -> np.ndarray:
    """The images in `sources` (files' paths, or their bytes), decoded by OpenCV to `shape`
    (height, width, channels) and stacked: float32 pixels in [0, 1], scaled once for the whole
    batch. Resized to `shape` where `resize` is set (by area when shrinking, bilinear when
    enlarging). A mistake names `where(i)` for the i-th source (the file, and the example's
    index) and how to `fix` it. OpenCV rather than Pillow: it decodes MNIST's PNG files several
    times as fast, and reads and decodes a file with the GIL released (docs/data.md,
    "Decoding")."""
    pixels = np.stack([_decode(source, where, i, shape, resize, fix)
                       for i, source in enumerate(sources)])  # fmt: skip
    batch = pixels.reshape(len(sources), *shape).astype(np.float32)
    batch /= 255.0
    return batch


def _decode(
    source: str | bytes,
    where: Callable[[int], str],
    i: int,
    shape: tuple[int, int, int],
    resize: bool,
    fix: str,
) -> np.ndarray:
    """One image as uint8 (height, width[, channels])."""
    cv2 = _opencv()
    height, width, channels = shape
    mode = cv2.IMREAD_GRAYSCALE if channels == 1 else cv2.IMREAD_COLOR
    flags = mode | cv2.IMREAD_IGNORE_ORIENTATION  # as Pillow: EXIF orientation not applied
    if isinstance(source, str):
        image = cv2.imread(source, flags)
        if image is None:  # a file it cannot read, or not an image
            try:
                open(source, "rb").close()
            except OSError as error:
                raise UsageError(
                    f"{where(i)} cannot be read ({error.strerror}); {fix}, then continue with "
                    "--resume"
                ) from None
    else:
        image = cv2.imdecode(np.frombuffer(source, np.uint8), flags) if source else None
    if image is None:
        raise UsageError(f"{where(i)} is not a readable image; {fix}, then continue with --resume")
    if channels == 3:
        image = cv2.cvtColor(image, cv2.COLOR_BGR2RGB)
    if resize and image.shape[:2] != (height, width):
        shrinks = height <= image.shape[0] and width <= image.shape[1]
        method = cv2.INTER_AREA if shrinks else cv2.INTER_LINEAR
        image = cv2.resize(image, (width, height), interpolation=method)
    if image.shape[:2] != (height, width):
        raise UsageError(
            f"{where(i)} is {image.shape[1]}x{image.shape[0]}, and data.input_shape asks for "
            f"{width}x{height}; set data.resize = true to resize every image, or give the "
            "images' size"
        )
    return image


@functools.cache
def _opencv() -> Any:
    """OpenCV, quiet (it would log each image it cannot decode; the error names it instead) and
    without its own thread pool (the data workers are the threads)."""
    import cv2

    cv2.setNumThreads(0)
    cv2.utils.logging.setLogLevel(cv2.utils.logging.LOG_LEVEL_SILENT)
    return cv2


def load_folder(data: SourceTable) -> Splits:
    assert data.path is not None and data.input_shape is not None and data.num_classes
    root = Path(data.path)
    classes = _classes(root / "train")
    if len(classes) != data.num_classes:
        raise UsageError(
            f"{root / 'train'} has {len(classes)} class folders, and data.num_classes is "
            f"{data.num_classes}; make them agree"
        )
    return Splits(*(_split(root / name, classes, data) for name in ("train", "test")))


def _classes(folder: Path) -> list[str]:
    if not folder.is_dir():
        raise UsageError(
            f"data.path: {folder} is not a folder; give a folder holding train/ and test/, each "
            "with one folder of images per class"
        )
    return sorted(entry.name for entry in folder.iterdir() if entry.is_dir())


def _split(folder: Path, classes: list[str], data: SourceTable) -> ImageFolder:
    found = _classes(folder)
    if found != classes:
        missing = sorted(set(classes) - set(found)) or sorted(set(found) - set(classes))
        raise UsageError(
            f"{folder}'s class folders differ from train/'s (at {missing[0]!r}); give both "
            "splits the same class folders"
        )
    files, labels = [], []
    for label, name in enumerate(classes):
        images = sorted(p for p in (folder / name).iterdir() if p.suffix.lower() in SUFFIXES)
        if not images:
            raise UsageError(f"{folder / name} holds no .png or .jpg images; add some or remove it")
        files += [str(p).encode() for p in images]
        labels += [label] * len(images)
    assert data.input_shape is not None
    return ImageFolder(np.array(files), np.array(labels, dtype=np.int64), data.input_shape,
                       bool(data.resize))  # fmt: skip
