"""How a sharded run cuts the training state among the ranks, whatever the framework: the
parameters' elements end to end in each bucket of the exchange (in the order the backward pass
fills them), each bucket cut into one part per rank. docs/sharding.md says why so."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# Element-wise cuts fall this many elements apart, counted from their parameter's start.
ALIGNMENT = 64


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
    `whole`: cuts only at parameters' edges, and where they fall evens out what each rank holds
    over all the buckets (a bucket of one large parameter goes whole to the rank that holds
    least so far). `widths[b]`: the longest cut, which every cut is padded to where bucket b is
    reduce-scattered."""

    def __init__(self, sizes: list[int], buckets: list[list[int]], ranks: int,
                 whole: bool) -> None:  # fmt: skip
        self.sizes, self.buckets, self.ranks = sizes, buckets, ranks
        self.starts: list[dict[int, int]] = []  # per bucket, each parameter's first element
        self.cuts: list[list[int]] = []
        held = [0] * ranks  # with `whole`, what each rank holds of the buckets cut so far
        for indices in buckets:
            edges = np.cumsum([0, *(sizes[i] for i in indices)]).tolist()
            self.starts.append(dict(zip(indices, edges, strict=False)))
            total = edges[-1]
            if whole:
                cuts = [_nearest(edges, cut) for cut in _evening(held, total)]
                held = [h + b - a for h, a, b in zip(held, cuts, cuts[1:], strict=False)]
            else:
                # As even as can be (the first total % ranks one element longer), then moved.
                even = [r * (total // ranks) + min(r, total % ranks) for r in range(ranks + 1)]
                cuts = [_aligned(edges, cut) for cut in even]
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


def _aligned(edges: list[int], cut: int) -> int:
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


def _nearest(edges: list[int], cut: float) -> int:
    """The parameters' edge nearest to `cut` (the lower of two as near)."""
    return min(edges, key=lambda edge: (abs(edge - cut), edge))
