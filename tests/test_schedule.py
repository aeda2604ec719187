import math

import pytest

from hvd_train.recipe import Schedule
from hvd_train.schedule import LearningRateSchedule, scaled_learning_rate


def test_scaling_rules():
    assert scaled_learning_rate(0.001, 4, "linear") == pytest.approx(0.004)
    assert scaled_learning_rate(0.001, 4, "sqrt") == pytest.approx(0.002)
    assert scaled_learning_rate(0.001, 4, "none") == pytest.approx(0.001)


def schedule(decay: str, warmup: float = 1.0) -> LearningRateSchedule:
    config = Schedule(
        epochs=4, batch_size=64, lr_scaling="linear", warmup_epochs=warmup, decay=decay
    )
    return LearningRateSchedule.from_recipe(config, base=0.001, scale=2, steps_per_epoch=100)


def test_warmup_ramps_from_base_to_the_scaled_rate():
    lr = schedule("none")
    assert lr(0) == pytest.approx(0.001)
    assert lr(50) == pytest.approx(0.0015)
    assert lr(100) == pytest.approx(0.002)
    assert lr(399) == pytest.approx(0.002)
    assert all(lr(s) <= lr(s + 1) for s in range(100))


def test_cosine_decays_from_peak_towards_zero():
    lr = schedule("cosine")
    assert lr(100) == pytest.approx(0.002)
    assert lr(250) == pytest.approx(0.001)
    assert 0 < lr(399) < 0.002 * (1 - math.cos(math.pi / 300))
    assert all(lr(s) >= lr(s + 1) for s in range(100, 399))


def test_no_warmup_starts_at_peak():
    assert schedule("cosine", warmup=0.0)(0) == pytest.approx(0.002)
