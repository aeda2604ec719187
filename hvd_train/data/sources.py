"""The data sources a recipe's `[data] dataset` names, in one table: which keys of `[data]`
each reads, which it needs, what it fills in, and its loader (imported only when used: Parquet
brings pyarrow, for one). A new source is a module of `data/` and an entry here: the recipe's
`Data` table checks every key against this table, so a key the source does not read is refused
by name, never ignored."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from hvd_train.data.base import SourceTable, Splits

MNIST_SHAPE, MNIST_CLASSES = (28, 28, 1), 10
# The [data] keys that a source may read, in the order they are checked; `dataset` and
# `transforms` are every source's.
SOURCE_KEYS = ("path", "input_shape", "num_classes", "train_samples", "test_samples", "resize",
               "input", "label")  # fmt: skip


@dataclass(frozen=True)
class Source:
    load: Callable[[SourceTable, Path | None], Splits]  # the table, and where MNIST's files are
    reads: tuple[str, ...]  # of SOURCE_KEYS
    # What it cannot do without, and why ("npz data needs it (the file is checked against it)").
    needs: tuple[str, ...] = ()
    why: str = ""
    defaults: Mapping[str, Any] = field(default_factory=dict)  # filled where not given
    fixed: Mapping[str, Any] = field(default_factory=dict)  # a given value must be this one
    check: Callable[[SourceTable], None] | None = None  # what the table alone cannot say


def _mnist(data: SourceTable, data_dir: Path | None) -> Splits:
    from hvd_train.data.mnist import load_mnist

    return load_mnist(data_dir)


def _npz(data: SourceTable, data_dir: Path | None) -> Splits:
    from hvd_train.data.npz import load_npz

    return load_npz(data)


def _folder(data: SourceTable, data_dir: Path | None) -> Splits:
    from hvd_train.data.folder import load_folder

    return load_folder(data)


def _parquet(data: SourceTable, data_dir: Path | None) -> Splits:
    from hvd_train.data.parquet import load_parquet  # pyarrow: docs/history.md, "A job's start"

    return load_parquet(data)


def _records(data: SourceTable, data_dir: Path | None) -> Splits:
    from hvd_train.data.records import load_records

    return load_records(data)


def _synthetic(data: SourceTable, data_dir: Path | None) -> Splits:
    from hvd_train.data.synthetic import load_synthetic

    return load_synthetic(data)


def _image_channels(data: SourceTable) -> None:
    """Folder and Parquet images are grey or RGB."""
    if data.input_shape[2] not in (1, 3):  # type: ignore[index]
        raise data.fail("input_shape", f"{data.dataset} images have 1 channel (grey) or 3 (RGB)")


IMAGES = ("path", "input_shape", "num_classes")  # what image sources are checked against
SOURCES: Mapping[str, Source] = MappingProxyType({
    "mnist": Source(_mnist, reads=("input_shape", "num_classes"),
                    fixed={"input_shape": MNIST_SHAPE, "num_classes": MNIST_CLASSES}),
    "npz": Source(_npz, reads=IMAGES, needs=IMAGES,
                  why="npz data needs it (the file is checked against it)"),
    "folder": Source(_folder, reads=(*IMAGES, "resize"), needs=IMAGES,
                     why="folder data needs it (the images are checked against it)",
                     defaults={"resize": False}, check=_image_channels),
    "parquet": Source(_parquet, reads=(*IMAGES, "resize", "input", "label"), needs=IMAGES,
                      why="parquet data needs it (the images are checked against it)",
                      # Hugging Face's column names
                      defaults={"resize": False, "input": "image", "label": "label"},
                      check=_image_channels),
    "records": Source(_records, reads=IMAGES, needs=IMAGES,
                      why="records need it (the files are checked against it)"),
    "synthetic": Source(_synthetic, reads=("input_shape", "num_classes", "train_samples",
                                           "test_samples"),
                        defaults={"input_shape": MNIST_SHAPE, "num_classes": MNIST_CLASSES,
                                  "train_samples": 60000, "test_samples": 10000}),
})  # fmt: skip


def readers(key: str) -> str:
    """The sources that read `key`, as a message names them: 'npz', 'folder' or 'records'."""
    *others, last = (repr(name) for name, source in SOURCES.items() if key in source.reads)
    return f"{', '.join(others)} or {last}" if others else last


def checked_source_keys(data: SourceTable) -> dict[str, Any]:
    """The values `data`'s source gives the keys it reads: each given one checked, the missing
    ones filled in; a key it does not read is refused, naming the sources that do."""
    source, filled = SOURCES[data.dataset], {}
    for key in SOURCE_KEYS:
        value = getattr(data, key)
        if key not in source.reads:
            if value is not None:
                raise data.fail(key, f"only used with dataset = {readers(key)}; remove it")
        elif key in source.fixed:
            fixed = source.fixed[key]
            if value not in (None, fixed):
                shown = list(fixed) if isinstance(fixed, tuple) else fixed
                raise data.fail(key, f"{data.dataset} data has {shown}; leave it out or give that")
            filled[key] = fixed
        elif value is None and key in source.needs:
            raise data.fail(key, f"missing; {source.why}")
        elif value is None and key in source.defaults:
            filled[key] = source.defaults[key]
    return filled


def load_from_source(data: SourceTable, data_dir: Path | None) -> Splits:
    """`data`'s examples as its source gives them, without transforms; `data_dir` is where
    MNIST's files are (default: the cache)."""
    return SOURCES[data.dataset].load(data, data_dir)
