import numpy as np
import pytest

from hvd_train.data.sharding import epoch_order, eval_indices, shard_batches, steps_per_epoch
from hvd_train.errors import UsageError


@pytest.mark.parametrize(
    ("samples", "world", "batch"),
    [(60000, 2, 64), (60000, 3, 64), (1001, 4, 10), (10, 3, 2), (7, 2, 3)],
)
def test_shards_are_disjoint_cover_everything_and_take_equal_steps(samples, world, batch):
    order = epoch_order(samples, seed=1, epoch=0)
    per_rank = [shard_batches(order, rank, world, batch) for rank in range(world)]
    steps = {len(batches) for batches in per_rank}
    assert steps == {steps_per_epoch(samples, world, batch)}
    seen = np.concatenate([np.concatenate(batches) for batches in per_rank])
    assert len(seen) == samples
    assert np.array_equal(np.sort(seen), np.arange(samples))
    sizes = [len(b) for batches in per_rank for b in batches]
    assert min(sizes) >= 1 and max(sizes) <= batch


def test_order_is_shared_by_ranks_and_reshuffled_every_epoch():
    assert np.array_equal(epoch_order(100, 7, 0), epoch_order(100, 7, 0))
    assert not np.array_equal(epoch_order(100, 7, 0), epoch_order(100, 7, 1))
    assert not np.array_equal(epoch_order(100, 7, 0), epoch_order(100, 8, 0))


def test_too_small_a_dataset_for_the_world_is_refused():
    with pytest.raises(UsageError, match="raise --batch-size or use fewer processes"):
        steps_per_epoch(5, 2, 1)


@pytest.mark.parametrize(("samples", "world"), [(10000, 2), (10000, 3), (7, 4)])
def test_evaluation_counts_every_image_exactly_once(samples, world):
    parts = [eval_indices(samples, rank, world) for rank in range(world)]
    assert np.array_equal(np.concatenate(parts), np.arange(samples))
