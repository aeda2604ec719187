"""How a step's gradients travel: in buckets that leave while the last backward pass goes on
(overlap), or in one group after it; and "auto", which decides from the first steps' times."""

from __future__ import annotations

import numpy as np

# Gradients travel in buckets of about this size when they overlap the backward pass, so that
# the bucket the pass finishes last is small. How it was chosen: docs/history.md, "Overlap and
# models of real size".
BUCKET_BYTES = 4 * 2**20
# "auto" times this many steps (after the first, which warms up) with the exchange after the
# pass, then overlaps if the wait for it was at least SYNC_SHARE of the passes' time.
TRIAL_STEPS, SYNC_SHARE = 4, 0.1


def buckets(sizes: list[int], limit: int = BUCKET_BYTES) -> list[list[int]]:
    """The gradients' indices in the order the backward pass makes them (the last layers'
    first), in buckets closed as they reach `limit` bytes."""
    groups: list[list[int]] = [[]]
    filled = 0
    for index in reversed(range(len(sizes))):
        if filled >= limit:
            groups.append([])
            filled = 0
        groups[-1].append(index)
        filled += sizes[index]
    return groups


class OverlapChoice:
    """Whether a step's gradients travel in buckets while its last backward pass goes on, or in
    one group after it: the setting (`[horovod] overlap`), or, for "auto", decided from the
    first steps' own times. Each step's exchange carries the times of the step before (T_comp,
    T_sync), so every rank decides on the same, rank-averaged figures. Overlap needs more than
    one bucket, and it costs cores the pass could use, so "auto" takes it only where the
    exchange kept the step waiting."""

    def __init__(self, setting: bool | str, bucket_count: int) -> None:
        self.setting, self.bucket_count = setting, bucket_count
        self.restart()

    def restart(self) -> None:
        """Back to the first step's choice, on every rank at once (after an elastic reset), so
        that a worker that just joined decides with the others: ranks that sent their
        gradients in different groups would wait for each other for ever."""
        self.overlap = self.setting is True and self.bucket_count > 1
        self.deciding = self.setting == "auto" and self.bucket_count > 1
        self.steps, self.times = 0, np.zeros(2)
        self.last = np.zeros(2)  # this rank's T_comp and T_sync in the step just taken

    def record(self, compute: float, sync: float, averaged: np.ndarray) -> None:
        """This rank's times of the step just taken, and the rank-averaged times that travelled
        with it (those of the step before); decides once enough are in."""
        self.last = np.array([compute, sync])
        if not self.deciding:
            return
        self.steps += 1
        if self.steps > 2:  # the first step warms up; the second carries its times
            self.times += averaged
        if self.steps == TRIAL_STEPS + 2:
            compute_total, sync_total = self.times
            self.overlap, self.deciding = bool(sync_total >= SYNC_SHARE * compute_total), False
