"""Images in Parquet tables, as Hugging Face's Hub, Spark and pandas write them: the
`train*.parquet` files of `path` (or those of its `train/` folder), and the `test*` ones. The
`input` column holds encoded images (PNG or JPEG bytes, or Hugging Face's image struct of
`bytes` and `path`) or their pixels (lists of numbers, flat or nested: uint8 is scaled to
[0, 1], floats are taken as they are); the `label` column, integer class labels.

Parquet compresses its columns, so a row cannot be read alone. As Hugging Face `datasets` does,
each file is copied once, uncompressed, to an Arrow file in the cache (one process per host
writes it; the others wait) and every rank memory-maps the copies: a batch reads the pages of
its own rows, so a rank's memory does not grow with the table's size. The copy is made again
when the file changes.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from hvd_train.data.base import SourceTable, Splits, cache_root, located
from hvd_train.data.folder import decode_images
from hvd_train.errors import UsageError

FIX = "fix or remove that row"


@dataclass(frozen=True)
class ParquetTable:
    """One split: the memory-mapped Arrow copies of its files, as one table."""

    table: pa.Table  # the input and label columns
    files: tuple[Path, ...]
    starts: np.ndarray  # the index of each file's first example
    input: str
    label: str
    shape: tuple[int, int, int]
    resize: bool

    def __len__(self) -> int:
        return self.table.num_rows

    def __getitem__(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        rows = self.table.take(pa.array(np.asarray(indices, dtype=np.int64)))
        column, labels = rows.column(self.input).combine_chunks(), rows.column(self.label)
        if pa.types.is_struct(column.type):  # Hugging Face's Image feature
            column = pc.struct_field(column, "bytes")
        if pa.types.is_binary(column.type) or pa.types.is_large_binary(column.type):
            x = decode_images(column.to_pylist(), lambda i: self.where(int(indices[i])),
                              self.shape, self.resize, FIX)  # fmt: skip
        else:
            x = self.pixels(column, indices)
        return x, labels.to_numpy().astype(np.int64)

    def pixels(self, column: pa.Array, indices: np.ndarray) -> np.ndarray:
        """The rows of a column of lists of numbers, as images of `shape`."""
        size = int(np.prod(self.shape))
        lengths, values = _numbers_in(column)
        wrong = np.flatnonzero(lengths != size)
        if len(wrong):
            raise UsageError(
                f"{self.where(int(indices[wrong[0]]))} holds {lengths[wrong[0]]} numbers, and "
                f"data.input_shape {list(self.shape)} needs {size}; give every image that shape"
            )
        array = values.to_numpy(zero_copy_only=False).reshape(len(column), *self.shape)
        if array.dtype == np.uint8:
            return array.astype(np.float32) / 255.0
        return array.astype(np.float32)

    def where(self, index: int) -> str:
        """The file and row of example `index`, for messages."""
        return located(self.files, self.starts, index, "row")


def _numbers_in(lists: pa.Array) -> tuple[np.ndarray, pa.Array]:
    """How many numbers each row of `lists` (lists nested to any depth) holds, and the numbers
    of all the rows, in order."""
    if pa.types.is_fixed_size_list(lists.type):
        lengths = np.full(len(lists), lists.type.list_size, dtype=np.int64)
    else:
        lengths = pc.list_value_length(lists).to_numpy(zero_copy_only=False).astype(np.int64)
    values = lists.flatten()
    if not _is_list(values.type):
        return lengths, values
    inner, numbers = _numbers_in(values)
    ends, bounds = np.cumsum([0, *inner]), np.cumsum([0, *lengths])
    return ends[bounds[1:]] - ends[bounds[:-1]], numbers


def _is_list(kind: pa.DataType) -> bool:
    return pa.types.is_list(kind) or pa.types.is_large_list(kind) or \
        pa.types.is_fixed_size_list(kind)  # fmt: skip


def load_parquet(data: SourceTable) -> Splits:
    assert data.path is not None and data.input_shape is not None and data.num_classes
    root = Path(data.path)
    if not root.is_dir():
        raise UsageError(
            f"data.path: {root} is not a folder; give the folder holding the train*.parquet and "
            "test*.parquet files (or train/ and test/ folders of them)"
        )
    return Splits(*(_split(root, name, data) for name in ("train", "test")))


def _split(root: Path, name: str, data: SourceTable) -> ParquetTable:
    files = sorted(root.glob(f"{name}*.parquet")) + sorted(root.glob(f"{name}/*.parquet"))
    if not files:
        raise UsageError(
            f"{root} holds no {name}*.parquet file and no {name}/ folder of them; write the "
            f"{name} split there"
        )
    assert data.input is not None and data.label is not None and data.input_shape is not None
    tables = [_checked(file, memory_mapped([file], [data.input, data.label]), data)
              for file in files]  # fmt: skip
    lengths = [table.num_rows for table in tables]
    if not sum(lengths):
        raise UsageError(f"the {name}*.parquet files of {root} hold no rows; write some")
    return ParquetTable(
        _joined(tables, files),
        tuple(files), np.cumsum([0, *lengths[:-1]]), data.input, data.label, data.input_shape,
        bool(data.resize),
    )  # fmt: skip


def _checked(file: Path, table: pa.Table, data: SourceTable) -> pa.Table:
    """`table` (`file`'s input and label columns), its types and labels checked."""
    images, labels = table.column(data.input), table.column(data.label)
    kind = images.type
    encoded = (
        pa.types.is_binary(kind)
        or pa.types.is_large_binary(kind)
        or (pa.types.is_struct(kind) and kind.get_field_index("bytes") >= 0)
    )
    if not (encoded or _numbers(kind)):
        raise UsageError(
            f"{file}: column {data.input!r} is {kind}; it must hold encoded images (bytes) or "
            "their pixels (lists of numbers)"
        )
    if not pa.types.is_integer(labels.type):
        raise UsageError(
            f"{file}: column {data.label!r} is {labels.type}; it must hold integer class labels"
        )
    for column, name in ((images, data.input), (labels, data.label)):
        if column.null_count:
            row = pc.index(pc.is_null(column), True).as_py()
            raise UsageError(f"{file} row {row}: {name!r} is empty; fill or remove that row")
    low, high = (value.as_py() for value in pc.min_max(labels).values())
    classes = data.num_classes or 0
    if low is not None and (low < 0 or high >= classes):
        raise UsageError(
            f"{file}: column {data.label!r} has labels from {low} to {high}, outside 0 to "
            f"{classes - 1}; fix the labels or data.num_classes"
        )
    return table


def _numbers(kind: pa.DataType) -> bool:
    """Whether `kind` is a list (of lists ...) of integers or floats."""
    while _is_list(kind):
        kind = kind.value_type
        if pa.types.is_integer(kind) or pa.types.is_floating(kind):
            return True
    return False


def memory_mapped(files: Sequence[Path], columns: list[str]) -> pa.Table:
    """`columns` of the Parquet `files`, as one table read from their uncompressed Arrow copies
    in the cache (made first where need be), memory-mapped: for a Python recipe's own tables
    too (recipes/examples/text_parquet.py)."""
    tables = [pa.ipc.open_file(pa.memory_map(str(_arrow_copy(Path(f), columns)))).read_all()
              for f in files]  # fmt: skip
    return _joined(tables, files)


def _joined(tables: list[pa.Table], files: Sequence[Path]) -> pa.Table:
    try:
        return pa.concat_tables(tables)
    except pa.ArrowInvalid:
        differs = next(
            f for f, t in zip(files, tables, strict=True) if t.schema != tables[0].schema
        )
        raise UsageError(
            f"{differs}'s columns differ in type from {files[0]}'s; write the files alike"
        ) from None


def _arrow_copy(file: Path, columns: list[str]) -> Path:
    stat = file.stat()
    key = json.dumps([str(file.resolve()), stat.st_size, stat.st_mtime_ns, columns])
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    copy = cache_root() / "arrow" / f"{file.stem}-{digest}.arrow"
    if copy.exists():
        return copy
    try:
        copy.parent.mkdir(parents=True, exist_ok=True)
        with copy.with_suffix(".lock").open("a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # one process writes it; the others wait here
            if not copy.exists():
                _write_copy(file, columns, copy)
    except OSError as error:
        raise UsageError(
            f"cannot write the Arrow copy of {file} in {copy.parent} ({error}); free some "
            "space there or set HVD_TRAIN_CACHE to a folder with room"
        ) from None
    return copy


def _write_copy(file: Path, columns: list[str], copy: Path) -> None:
    partial = copy.with_suffix(f".{os.getpid()}.partial")
    try:
        batches = _batches(file, columns)
        first = next(batches)
        with pa.OSFile(str(partial), "wb") as sink, pa.ipc.new_file(sink, first.schema) as out:
            out.write_batch(first)
            for batch in batches:
                out.write_batch(batch)
        os.replace(partial, copy)
    finally:
        partial.unlink(missing_ok=True)


def _batches(file: Path, columns: list[str]) -> Iterator[pa.RecordBatch]:
    """`file`'s `columns`, a batch at a time (an empty one for an empty file); a file that is
    not Parquet, or lacks a column, is one line."""
    try:
        parquet = pq.ParquetFile(file)
        names = parquet.schema_arrow.names
        missing = [column for column in columns if column not in names]
        if missing:
            raise UsageError(
                f"{file} has no column {missing[0]!r} (it has {', '.join(map(repr, names))}); "
                "name the columns it has (in a recipe: data.input and data.label)"
            )
        schema = pa.schema([parquet.schema_arrow.field(column) for column in columns])
        yielded = False
        for batch in parquet.iter_batches(batch_size=1024, columns=columns):
            yielded = True
            yield batch
        if not yielded:
            yield pa.RecordBatch.from_pylist([], schema=schema)
    except (pa.ArrowException, OSError) as error:
        raise UsageError(
            f"{file} is not a readable Parquet file ({error}); write it again, then continue "
            "with --resume"
        ) from None
