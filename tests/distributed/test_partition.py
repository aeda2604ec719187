"""How a sharded run cuts the buckets among the ranks (`Partition`): every element of every
bucket held by one rank; element-wise cuts near the even ones, on multiples of 64 elements into
their parameter; whole-tensor cuts at parameters' edges only, evening out what each rank holds
over all the buckets."""

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
