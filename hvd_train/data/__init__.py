"""Data behind one interface: every source becomes `Splits` of two `Dataset`s (three, with a
validation split set aside). The sources register in `sources.py`; `pipeline.py` reads a rank's
batches ahead of the step; `sharding.py` says which examples each rank takes."""

from hvd_train.data.base import ArrayDataset, Dataset, Splits, batch_size, take
from hvd_train.data.splits import check_labels, load_data, load_source, with_validation

__all__ = ["ArrayDataset", "Dataset", "Splits", "batch_size", "check_labels", "load_data",
           "load_source", "take", "with_validation"]  # fmt: skip
