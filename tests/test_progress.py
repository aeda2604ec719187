from hvd_train.progress import Position, Progress


def test_positions_survive_a_change_of_world_size_in_samples():
    two = Progress.for_world(60000, world_size=2, batch_size=64, limit_steps=None)
    one = Progress.for_world(60000, world_size=1, batch_size=64, limit_steps=None)
    assert (two.steps_per_epoch, two.global_batch) == (469, 128)
    middle = Position(epoch=1, step=100)
    assert two.samples(middle) == 12800 and two.global_step(middle) == 569
    assert one.position_at(1, two.samples(middle)) == Position(1, 200)
    assert two.position_at(1, 10**9) == Position(1, 469)  # never past the epoch's end


def test_limit_steps_caps_the_epoch():
    assert Progress.for_world(60000, 2, 64, limit_steps=40).steps_per_epoch == 40
