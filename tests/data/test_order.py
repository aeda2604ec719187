import numpy as np
import pytest

from hvd_train.data.order import epoch_order, eval_slice, rank_steps, steps_per_epoch
from hvd_train.errors import UsageError


@pytest.mark.parametrize(
    ("samples", "world", "batch", "passes"),
    [(60000, 2, 64, 1), (60000, 3, 64, 1), (1001, 4, 10, 1), (10, 3, 2, 1), (7, 2, 3, 1),
     (60000, 2, 64, 2), (1001, 4, 10, 3), (12, 2, 2, 3)],
)  # fmt: skip
def test_shards_are_disjoint_cover_everything_and_take_equal_whole_steps(
    samples, world, batch, passes
):
    order = epoch_order(samples, seed=1, epoch=0)
    per_rank = [rank_steps(order, rank, world, batch, passes) for rank in range(world)]
    assert {len(steps) for steps in per_rank} == {steps_per_epoch(samples, world, batch, passes)}
    assert {len(step) for steps in per_rank for step in steps} == {passes}  # whole steps only
    batches = [batch for steps in per_rank for step in steps for batch in step]
    seen = np.concatenate(batches)
    assert len(seen) == samples
    assert np.array_equal(np.sort(seen), np.arange(samples))
    assert min(map(len, batches)) >= 1 and max(map(len, batches)) <= batch


def test_order_is_shared_by_ranks_and_reshuffled_every_epoch():
    assert np.array_equal(epoch_order(100, 7, 0), epoch_order(100, 7, 0))
    assert not np.array_equal(epoch_order(100, 7, 0), epoch_order(100, 7, 1))
    assert not np.array_equal(epoch_order(100, 7, 0), epoch_order(100, 8, 0))


def test_too_small_a_dataset_for_the_world_is_refused():
    with pytest.raises(UsageError, match="raise --batch-size or use fewer processes"):
        steps_per_epoch(5, 2, 1)
    with pytest.raises(UsageError, match="cannot fill 4 batches on each of 2 ranks"):
        steps_per_epoch(7, 2, 3, passes=4)


@pytest.mark.parametrize(("samples", "world"), [(10000, 2), (10000, 3), (7, 4)])
def test_evaluation_counts_every_image_exactly_once(samples, world):
    parts = [eval_slice(samples, rank, world) for rank in range(world)]
    assert np.array_equal(np.concatenate(parts), np.arange(samples))
