"""How a sharded run cuts the buckets among the ranks (`Partition`): every element of every
bucket held by one rank; element-wise cuts near the even ones, on multiples of 64 elements into
their parameter; whole-tensor cuts at parameters' edges only (inside those too large to hold
whole, where asked), evening out what each rank holds over all the buckets, and buckets joined
until their cuts come near even, where asked."""

import numpy as np
import pytest

SIZES = [9, 1000, 130, 70_000, 5, 4096]
BUCKETS = [[5, 4, 3], [2, 1, 0]]


def partition(ranks: int, whole: bool, split: frozenset[int] = frozenset(), join: bool = False):
    from hvd_train.distributed.sharding import Partition

    return Partition(SIZES, BUCKETS, ranks, whole, split, join)


@pytest.mark.parametrize("whole", [False, True, "split", "joined"])
@pytest.mark.parametrize("ranks", [1, 2, 3, 8])
def test_every_element_is_held_by_one_rank_once(ranks, whole):
    from hvd_train.distributed.sharding import too_large

    split = too_large(SIZES, ranks) if whole in ("split", "joined") else frozenset()
    cut = partition(ranks, bool(whole), split, join=whole == "joined")
    for bucket, indices in enumerate(cut.buckets):
        held = {index: [] for index in indices}
        for rank in range(ranks):
            at = cut.cuts[bucket][rank]
            for piece in cut.pieces(rank)[bucket]:
                # A piece lies where its rank's cut of the bucket says.
                assert cut.starts[bucket][piece.index] + piece.start == at + piece.at
                held[piece.index].append((piece.start, piece.stop))
            assert cut.cuts[bucket][rank + 1] - at <= cut.widths[bucket]
        for index, ranges in held.items():
            assert sorted(ranges) == [(a, b) for a, b in sorted(ranges)]
            covered = [e for a, b in sorted(ranges) for e in range(a, b)]
            assert covered == list(range(SIZES[index]))
            if whole and index not in split:
                assert ranges == [(0, SIZES[index])]


def test_element_wise_cuts_are_near_even_and_aligned_within_their_parameter():
    cut = partition(3, whole=False)
    total = sum(SIZES[i] for i in BUCKETS[0])
    starts = cut.starts[0]
    for rank in range(1, 3):
        at = cut.cuts[0][rank]
        assert abs(at - rank * total / 3) <= 32
        owner = max((s, i) for i, s in starts.items() if s <= at)
        assert (at - owner[0]) % 64 == 0


def test_whole_tensor_cuts_even_out_what_each_rank_holds_over_the_buckets():
    cut = partition(2, whole=True)
    # Bucket 0: 4096, 5 and 70,000 elements; the even cut, 37,050.5, is nearest the edge at
    # 4101, so rank 1 holds 70,000 of them. Bucket 1 (1139 elements) then goes whole to rank 0.
    assert cut.cuts == [[0, 4101, 74101], [0, 1139, 1139]]
    assert cut.widths[1] == 1139
    # Buckets of one large tensor each (a transformer's, a wide MLP's) go to the ranks in turn,
    # not all to one.
    from hvd_train.distributed.sharding import Partition

    lone = Partition([1000] * 12, [[i] for i in range(12)], 3, whole=True)
    held = [sum(p.stop - p.start for pieces in lone.pieces(r) for p in pieces) for r in range(3)]
    assert held == [4000, 4000, 4000]


def test_only_a_parameter_too_large_to_hold_whole_is_cut_inside():
    from hvd_train.distributed.sharding import too_large

    # Over half of a rank's even share: the 70,000 elements at 2 ranks, none of them at 1.
    assert too_large(SIZES, 2) == {3}
    cut = partition(2, True, too_large(SIZES, 2))
    # The even cut of bucket 0 (37,050.5) lies inside parameter 3, which starts at 4101: it
    # falls on the multiple of 64 elements into it nearest.
    assert cut.cuts[0] == [0, 4101 + 32960, 74101]
    assert [p.stop - p.start for p in cut.pieces(0)[0]] == [4096, 5, 32960]


def test_joined_buckets_are_cut_near_even():
    from hvd_train.distributed.sharding import EVEN_ENOUGH, Partition

    # A wide MLP's buckets: a bias and a kernel each. Alone, each bucket goes to one rank, and
    # its collectives wait on that rank's part; joined, the ranks' parts come out the same.
    sizes = [4096 if i % 2 == 0 else 2**22 for i in range(48)]
    buckets = [[i + 1, i] for i in range(46, -1, -2)]
    for ranks in (2, 3, 8):
        alone = Partition(sizes, buckets, ranks, whole=True)
        joined = Partition(sizes, buckets, ranks, whole=True, join=True)
        for cut in (alone, joined):
            assert sorted(i for bucket in cut.buckets for i in bucket) == list(range(48))
            held = [sum(p.stop - p.start for b in cut.pieces(r) for p in b) for r in range(ranks)]
            assert max(held) - min(held) <= 2**22 + 4096
        evenness = [np.diff(cuts).sum() / (ranks * np.diff(cuts).max()) for cuts in joined.cuts]
        assert min(evenness[:-1]) >= EVEN_ENOUGH and len(joined.buckets) < len(buckets)
        assert max(np.diff(cuts).sum() / (ranks * np.diff(cuts).max()) for cuts in alone.cuts
                   ) <= 1 / ranks + 1e-3  # fmt: skip
