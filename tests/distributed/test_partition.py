"""How a sharded run cuts the buckets among the ranks (`Partition`): every element of every
bucket held by one rank; element-wise cuts near the even ones, on multiples of 64 elements into
their parameter; whole-tensor cuts at parameters' edges only."""

import pytest

SIZES = [9, 1000, 130, 70_000, 5, 4096]
BUCKETS = [[5, 4, 3], [2, 1, 0]]


def partition(ranks: int, whole: bool):
    from hvd_train.distributed.sharding import Partition

    return Partition(SIZES, BUCKETS, ranks, whole)


@pytest.mark.parametrize("whole", [False, True])
@pytest.mark.parametrize("ranks", [1, 2, 3, 8])
def test_every_element_is_held_by_one_rank_once(ranks, whole):
    cut = partition(ranks, whole)
    for bucket, indices in enumerate(BUCKETS):
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
            if whole:
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


def test_whole_tensor_cuts_fall_at_the_edges_nearest_the_even_ones():
    cut = partition(2, whole=True)
    # Bucket 1: 130, 1000 and 9 elements; the even cut, 569.5, is nearest the edge at 130.
    assert cut.cuts[1] == [0, 130, 1139]
    assert cut.widths[1] == 1009
