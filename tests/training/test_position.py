from hvd_train.recipe import Horovod, Schedule
from hvd_train.training.position import EpochPlan, Position

BATCH = Schedule(batch_size=64)


def test_positions_survive_a_change_of_world_size_in_samples():
    two = EpochPlan.for_world(60000, 2, BATCH, Horovod(), limit_steps=None)
    one = EpochPlan.for_world(60000, 1, BATCH, Horovod(), limit_steps=None)
    assert (two.steps_per_epoch, two.global_batch) == (469, 128)
    middle = Position(epoch=1, step=100)
    assert two.samples(middle) == 12800 and two.global_step(middle) == 569
    assert one.position_at(1, two.samples(middle)) == Position(1, 200)
    assert two.position_at(1, 10**9) == Position(1, 469)  # never past the epoch's end


def test_limit_steps_caps_the_epoch():
    assert EpochPlan.for_world(60000, 2, BATCH, Horovod(), limit_steps=40).steps_per_epoch == 40


def test_accumulated_passes_count_in_the_global_batch():
    two_passes = EpochPlan.for_world(60000, 2, BATCH, Horovod(backward_passes_per_step=2), None)
    assert (two_passes.steps_per_epoch, two_passes.global_batch) == (235, 256)
