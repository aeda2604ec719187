from types import SimpleNamespace

import numpy as np

from hvd_train.distributed import Loader
from hvd_train.training.position import EpochPlan, Position

EXAMPLES = (np.zeros((60000, 1), np.float32), np.zeros(60000, np.int64))


def plan(world_size: int, passes: int = 1, limit: int | None = None) -> EpochPlan:
    """The trainer's plan for MNIST's 60,000 examples in batches of 64, from its loader."""
    backend = SimpleNamespace(rank=0, world_size=world_size)
    loader = Loader(backend, EXAMPLES, 64, shuffle=True, seed=0, workers=0, prefetch=2,  # type: ignore[arg-type]
                    transforms=(), timeout=1.0, threads=1, passes=passes, limit=limit)  # fmt: skip
    return EpochPlan(len(loader), loader.global_batch)


def test_positions_survive_a_change_of_world_size_in_samples():
    two, one = plan(2), plan(1)
    assert (two.steps_per_epoch, two.global_batch) == (469, 128)
    middle = Position(epoch=1, step=100)
    assert two.samples(middle) == 12800 and two.global_step(middle) == 569
    assert one.position_at(1, two.samples(middle)) == Position(1, 200)
    assert two.position_at(1, 10**9) == Position(1, 469)  # never past the epoch's end


def test_limit_steps_caps_the_epoch():
    assert plan(2, limit=40).steps_per_epoch == 40


def test_accumulated_passes_count_in_the_global_batch():
    two_passes = plan(2, passes=2)
    assert (two_passes.steps_per_epoch, two_passes.global_batch) == (235, 256)
