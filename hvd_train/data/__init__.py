"""Data behind one interface: every source becomes `Splits` of two `Dataset`s (three, with a
validation split set aside). The sources register in `sources.py`; `pipeline.py` reads a rank's
batches ahead of the step; `order.py` says which examples each rank takes, in which order."""

from hvd_train.data.base import ArrayDataset, Dataset, Splits, batch_size, take
from hvd_train.data.splits import (
    check_labels,
    from_function,
    set_aside,
    with_evaluation_transforms,
)
from hvd_train.data.transforms import Transformed

__all__ = ["ArrayDataset", "Dataset", "Splits", "Transformed", "batch_size", "check_labels",
           "from_function", "set_aside", "take", "with_evaluation_transforms"]  # fmt: skip
