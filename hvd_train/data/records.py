"""Examples as records in ArrayRecord files, for the largest sets: the `train-*.array_record`
and `test-*.array_record` files of `path`, each record one example's input and label in
safetensors (`x`, `y`). ArrayRecord (the format Grain reads) finds a record by its index, so a
batch reads its own examples' bytes and a rank's memory does not grow with the set.
`hvd-train write-records` writes them from any recipe's data (`write_records`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import load as load_example
from safetensors.numpy import save as save_example
from tqdm import tqdm

from hvd_train.data.base import Dataset, SourceTable, Splits, located, take
from hvd_train.errors import UsageError

SUFFIX = ".array_record"
RECORDS_PER_FILE = 10_000
WRITE_BATCH = 256  # examples taken from the source at a time


@dataclass(frozen=True)
class RecordFiles:
    """One split: its record files, read by index."""

    source: Any  # array_record's ArrayRecordDataSource over `files`
    files: tuple[Path, ...]
    starts: np.ndarray  # the index of each file's first example

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        try:
            records = self.source.__getitems__([int(index) for index in indices])
        except Exception:  # array_record's reader found damage: which record is it?
            records = [self.record(int(index)) for index in indices]
        examples = [
            self.example(record, int(i)) for record, i in zip(records, indices, strict=True)
        ]
        return np.stack([e["x"] for e in examples]), np.stack([e["y"] for e in examples])

    def record(self, index: int) -> bytes:
        try:
            return bytes(self.source[index])
        except Exception as error:  # what the C++ reader reports
            raise self.damaged(index, error) from None

    def example(self, record: bytes, index: int) -> dict[str, np.ndarray]:
        try:
            return load_example(record)
        except Exception as error:  # safetensors raises its own SafetensorError
            raise self.damaged(index, error) from None

    def damaged(self, index: int, error: Exception) -> UsageError:
        return UsageError(
            f"{located(self.files, self.starts, index, 'record')} is damaged ({error}); write "
            "the record files again with hvd-train write-records, then continue with --resume"
        )


def load_records(data: SourceTable) -> Splits:
    assert data.path is not None and data.input_shape is not None and data.num_classes
    root = Path(data.path)
    if not root.is_dir():
        raise UsageError(
            f"data.path: {root} is not a folder; give the folder holding the train-*{SUFFIX} "
            f"and test-*{SUFFIX} files (hvd-train write-records writes them)"
        )
    splits = [_split(root, name) for name in ("train", "test")]
    for split in splits:
        x, y = split[np.array([0])]
        if x.shape[1:] != data.input_shape:
            raise UsageError(
                f"{split.files[0]} holds inputs of shape {list(x.shape[1:])}, and "
                f"data.input_shape is {list(data.input_shape)}; make them agree"
            )
        if y.dtype.kind not in "iu":
            raise UsageError(f"{split.files[0]} holds {y.dtype} labels; classes are integers")
    return Splits(*splits)


def _split(root: Path, name: str) -> RecordFiles:
    from array_record.python.array_record_data_source import ArrayRecordDataSource

    files = tuple(sorted(root.glob(f"{name}-*{SUFFIX}")))
    if not files:
        raise UsageError(f"{root} holds no {name}-*{SUFFIX} file; write them with hvd-train "
                         "write-records")  # fmt: skip
    lengths = []
    for file in files:
        try:
            lengths.append(len(ArrayRecordDataSource([str(file)])))
        except Exception as error:  # array_record raises what its C++ reader reports
            raise UsageError(f"{file} is not a readable ArrayRecord file ({error}); write "
                             "the record files again with hvd-train write-records"
                             ) from None  # fmt: skip
    empty = [file for file, length in zip(files, lengths, strict=True) if not length]
    if empty:
        raise UsageError(f"{empty[0]} holds no records; write the record files again")
    return RecordFiles(ArrayRecordDataSource([str(f) for f in files]), files,
                        np.cumsum([0, *lengths[:-1]]))  # fmt: skip


def write_records(splits: Splits, out: Path, per_file: int = RECORDS_PER_FILE) -> list[Path]:
    """Both splits' examples, as `take` gives them, into files of `per_file` examples in
    `out`; each file is written under another name and renamed when it is whole."""
    from array_record.python.array_record_module import ArrayRecordWriter

    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, dataset in (("train", splits.train), ("test", splits.test)):
        files = max(1, -(-len(dataset) // per_file))
        progress = tqdm(total=len(dataset), desc=f"{name} records", unit="example")
        for file in range(files):
            path = out / f"{name}-{file:05d}-of-{files:05d}{SUFFIX}"
            partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
            writer = ArrayRecordWriter(str(partial), "group_size:1")
            try:
                for batch in _batches(dataset, file * per_file, per_file):
                    _write(writer, *take(dataset, batch))
                    progress.update(len(batch))
                writer.close()
                partial.replace(path)
            finally:
                partial.unlink(missing_ok=True)
            written.append(path)
        progress.close()
    return written


def _write(writer: Any, x: Any, y: Any) -> None:
    if isinstance(x, dict) or isinstance(y, tuple):
        raise UsageError("records hold one input array and one label array per example; this "
                         "data has named inputs or several targets")  # fmt: skip
    for example in range(len(x)):
        writer.write(save_example({"x": x[example], "y": np.asarray(y[example])}))


def _batches(dataset: Dataset, first: int, count: int) -> Sequence[np.ndarray]:
    end = min(first + count, len(dataset))
    return [
        np.arange(start, min(start + WRITE_BATCH, end)) for start in range(first, end, WRITE_BATCH)
    ]
