"""How a sharded run cuts the training state among the ranks, whatever the framework: the
parameters' elements end to end in each bucket of the exchange (in the order the backward pass
fills them), each bucket cut into one part per rank. docs/sharding.md says why so."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# Element-wise cuts fall this many elements apart, counted from their parameter's start.
ALIGNMENT = 64
# Joined buckets (`Partition`'s `join`): a bucket is cut evenly enough where its elements fill
# this share of its parts padded to the longest; at most this many buckets a rank are joined.
EVEN_ENOUGH, JOINED_AT_MOST = 0.8, 2


@dataclass(frozen=True)
class Piece:
    """The elements [start, stop) of parameter `index` (in memory order) that a rank holds,
    `at` elements into its cut of their bucket."""

    index: int
    start: int
    stop: int
    at: int


class Partition:
    """Each bucket's cuts: rank r holds elements [cuts[b][r], cuts[b][r + 1]) of bucket b.
    `whole`: cuts at parameters' edges (inside the parameters in `split` too, on multiples of
    ALIGNMENT elements), where they even out what each rank holds over all the buckets (a
    bucket of one large parameter goes whole to the rank that holds least so far). `join`:
    with `whole`, the given buckets are joined, neighbour to neighbour, until each one's cuts
    come near even (`buckets` then lists the joined ones), so that no collective of a bucket
    waits on one rank's long part. `widths[b]`: the longest cut, which every cut is padded to
    where bucket b is reduce-scattered."""

    def __init__(self, sizes: list[int], buckets: list[list[int]], ranks: int, whole: bool,
                 split: frozenset[int] = frozenset(), join: bool = False) -> None:  # fmt: skip
        self.sizes, self.ranks = sizes, ranks
        self.buckets: list[list[int]] = []
        self.starts: list[dict[int, int]] = []  # per bucket, each parameter's first element
        self.cuts: list[list[int]] = []
        held = [0] * ranks  # with `whole`, what each rank holds of the buckets cut so far
        joining: list[int] = []  # the buckets being joined, end to end
        joined = 0  # how many
        for number, given in enumerate(buckets):
            indices = joining + given
            edges = np.cumsum([0, *(sizes[i] for i in indices)]).tolist()
            total = edges[-1]
            if whole:
                bounds = [(edges[k], edges[k + 1], i in split) for k, i in enumerate(indices)]
                cuts = [_nearest(bounds, cut) for cut in _evening(held, total)]
                parts = np.diff(cuts)
                even = total >= EVEN_ENOUGH * ranks * parts.max()
                joined += 1
                if join and not even and joined < JOINED_AT_MOST * ranks and (
                        number < len(buckets) - 1):  # fmt: skip
                    joining = indices
                    continue
                held = [h + part for h, part in zip(held, parts.tolist(), strict=True)]
            else:
                # As even as can be (the first total % ranks one element longer), then moved.
                even_cuts = [r * (total // ranks) + min(r, total % ranks) for r in range(ranks + 1)]
                cuts = [_aligned(edges, cut) for cut in even_cuts]
            joining, joined = [], 0
            self.buckets.append(indices)
            self.starts.append(dict(zip(indices, edges, strict=False)))
            self.cuts.append(cuts)
        self.widths = [max(1, *np.diff(cuts).tolist()) for cuts in self.cuts]
        self.offsets = np.cumsum([0, *self.widths]).tolist()  # each bucket's cut in a shard
        # Each bucket's place in all the gradients end to end (the exchange's flat buffer).
        self.flat_offsets = np.cumsum([0, *(cuts[-1] for cuts in self.cuts)]).tolist()

    def pieces(self, rank: int) -> list[list[Piece]]:
        """Per bucket, what `rank` holds of its parameters, in bucket order."""
        held: list[list[Piece]] = []
        for indices, starts, cuts in zip(self.buckets, self.starts, self.cuts, strict=True):
            low, high = cuts[rank], cuts[rank + 1]
            held.append([])
            for index in indices:
                first, last = starts[index], starts[index] + self.sizes[index]
                if max(low, first) < min(high, last):
                    start, stop = max(low, first) - first, min(high, last) - first
                    held[-1].append(Piece(index, start, stop, first + start - low))
        return held


def too_large(sizes: list[int], ranks: int) -> frozenset[int]:
    """The parameters larger than half of what each rank holds when all is shared out evenly:
    held whole, one of them would leave that rank holding well above its share."""
    share = sum(sizes) / ranks
    return frozenset(index for index, size in enumerate(sizes) if size > share / 2)


def _aligned(edges: list[int], cut: float) -> int:
    """`cut` moved to the nearest multiple of ALIGNMENT elements into its parameter (or its
    end): torch's fused CPU kernels take a tensor in vectors of up to 16 elements, and the
    last few alone, with other roundings; a piece cut so is taken in the same vectors as its
    whole."""
    start = max(edge for edge in edges if edge <= cut)
    end = min([edge for edge in edges if edge > start] or [start])
    return min(start + round((cut - start) / ALIGNMENT) * ALIGNMENT, end)


def _evening(held: list[int], total: int) -> list[float]:
    """Where `total` more elements would be cut so that each rank, holding `held` so far,
    comes as near the same as can be: those below the mean are given what they lack."""
    if total == 0:
        return [0.0] * (len(held) + 1)
    goal = (sum(held) + total) / len(held)
    lacking = [max(0.0, goal - h) for h in held]
    share = [total * lack / sum(lacking) for lack in lacking]
    return [float(x) for x in np.cumsum([0.0, *share])]


def _nearest(bounds: list[tuple[int, int, bool]], cut: float) -> int:
    """Where `cut` falls: on the multiple of ALIGNMENT elements nearest it inside a parameter
    that may be split (`bounds`: each parameter's first and last-plus-one element, and
    whether it may), else on the parameters' edge nearest it (the lower of two as near)."""
    for first, last, split in bounds:
        if split and first < cut < last:
            return _aligned([first, last], cut)
    edges = [bounds[0][0], *(last for _, last, _ in bounds)] if bounds else [0]
    return min(edges, key=lambda edge: (abs(edge - cut), edge))
