"""Hugging Face `datasets.Dataset`s, handed over by a Python recipe's `data()`: Arrow tables,
memory-mapped from the files `load_dataset` or `load_from_disk` left in their cache, so a rank
reads the pages of its own rows and nothing is copied whole. A batch of rows is read in Hugging
Face's NumPy format, which decodes images and lists.

The `label` column gives the labels; the other columns are the inputs. One column of a fixed
shape is the model's input; otherwise the model takes them by name, a variable-length list
column being a sequence input (padded per batch, with its mask). A list column whose rows all
have one shape (what `Dataset.from_dict` makes of arrays) is of a fixed shape, as `datasets`'
NumPy format stacks it. An `Image` column's pixels become float32 in [0, 1], (height, width,
channels). Shape a dataset to this with its own methods: `rename_column`, `select_columns`,
`cast_column`, `map`.

`datasets` is not a dependency of hvd_train: a recipe that hands one over has it installed.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

import numpy as np

from hvd_train.errors import UsageError

LABEL = "label"
KINDS = ("Dataset", "DatasetDict", "IterableDataset", "IterableDatasetDict")


def is_hugging_face(part: Any) -> bool:
    """Whether `part` is one of `datasets`' dataset objects (a recipe that hands one over has
    imported it; it is not imported here)."""
    datasets = sys.modules.get("datasets")
    kinds = tuple(getattr(datasets, name) for name in KINDS if hasattr(datasets, name))
    return isinstance(part, tuple(kind for kind in kinds if isinstance(kind, type)))


def hugging_face(part: Any, what: str) -> HubDataset:
    """`part` (a `datasets.Dataset`) as a Dataset; anything else of `datasets` is one line."""
    import datasets

    if isinstance(part, datasets.DatasetDict):
        raise UsageError(f"{what} part is a DatasetDict; give its splits, as (dataset['train'], "
                         "dataset['test'])")  # fmt: skip
    if not isinstance(part, datasets.Dataset):
        raise UsageError(
            f"{what} part is a {type(part).__name__}, which has no length or rows by index; "
            "load it without streaming=True (a Dataset, memory-mapped from disk)"
        )
    features = part.features
    if LABEL not in features:
        raise UsageError(
            f"{what} part has no {LABEL!r} column (it has {', '.join(map(repr, features))}); "
            f"name its labels {LABEL!r} (dataset.rename_column)"
        )
    inputs = tuple(name for name in features if name != LABEL)
    if not inputs:
        raise UsageError(f"{what} part has only a {LABEL!r} column; give it an input column")
    images = frozenset(name for name in inputs if isinstance(features[name], datasets.Image))
    lists = [name for name in inputs if _variable_length(features[name])]
    sequences = frozenset(name for name in lists if not _one_shape(part, name))
    return HubDataset(part.with_format("numpy"), inputs, images, sequences, what)


def _variable_length(feature: Any) -> bool:
    """Whether `feature` is a list without a fixed length (`List`, `Sequence`, `LargeList`)."""
    import datasets

    kinds = tuple(getattr(datasets, name) for name in ("List", "Sequence", "LargeList")
                  if hasattr(datasets, name))  # fmt: skip
    return isinstance(feature, list) or (
        isinstance(feature, kinds) and getattr(feature, "length", -1) == -1
    )


def _one_shape(part: Any, name: str) -> bool:
    """Whether every row of the list column `name` has one shape, at every depth: read from
    the Arrow lists' lengths, chunk by chunk (nothing copied whole)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    shapes = set()
    for chunk in part.data.column(name).chunks:
        shape, values = [], chunk
        while isinstance(values, pa.ListArray | pa.LargeListArray | pa.FixedSizeListArray):
            if values.null_count:
                return False
            lengths = pc.min_max(pc.list_value_length(values))
            if lengths["min"].as_py() != lengths["max"].as_py():
                return False
            shape.append(lengths["min"].as_py())
            values = values.flatten()
        shapes.add(tuple(shape))
    return len(shapes) <= 1


@dataclass(frozen=True)
class HubDataset:
    """One split: the dataset in NumPy format, and what its input columns hold."""

    rows: Any  # datasets.Dataset
    inputs: tuple[str, ...]
    images: frozenset[str]
    sequences: frozenset[str]
    what: str

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, indices: np.ndarray) -> tuple[Any, np.ndarray]:
        batch = self.read(np.asarray(indices, dtype=np.int64))
        x = {name: self.column(batch[name], name, indices) for name in self.inputs}
        if len(x) == 1 and not self.sequences:
            return x[self.inputs[0]], batch[LABEL]
        return x, batch[LABEL]

    def read(self, indices: np.ndarray) -> dict[str, Any]:
        """The rows `indices`; a row that fails to decode is named."""
        try:
            return self.rows[indices]
        except (OSError, ValueError):  # Pillow's UnidentifiedImageError is an OSError
            for index in map(int, indices):
                try:
                    self.rows[index]
                except (OSError, ValueError) as error:
                    raise UsageError(
                        f"{self.what} part's example {index} cannot be read ({error}); fix or "
                        "remove it, then continue with --resume"
                    ) from None
            raise

    def column(self, values: np.ndarray, name: str, indices: np.ndarray) -> Any:
        if name in self.sequences:  # always a list, padded with its mask (base.take)
            return list(values)
        if name not in self.images:
            return values
        if values.dtype == object:
            shapes = [np.shape(image) for image in values]
            row = next(i for i, shape in enumerate(shapes) if shape != shapes[0])
            raise UsageError(
                f"{self.what} part's images {name!r} differ in shape ({shapes[0]} at example "
                f"{indices[0]}, {shapes[row]} at example {indices[row]}); give them one "
                "(dataset.cast_column with Image(mode=...), or a resize in dataset.map)"
            )
        if values.dtype != np.uint8:
            raise UsageError(
                f"{self.what} part's images {name!r} are {values.dtype}; give 8-bit images "
                "(dataset.cast_column with Image(mode='L') or Image(mode='RGB'))"
            )
        pixels = values.astype(np.float32) / 255.0
        return pixels[..., np.newaxis] if pixels.ndim == 3 else pixels
