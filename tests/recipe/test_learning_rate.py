import math

import pytest
import torch

from hvd_train.errors import UsageError
from hvd_train.recipe import Schedule
from hvd_train.recipe.learning_rate import LearningRateSchedule, scaling_factor


def test_scaling_rules():
    assert 0.001 * scaling_factor(4, "linear") == pytest.approx(0.004)
    assert 0.001 * scaling_factor(4, "sqrt") == pytest.approx(0.002)
    assert 0.001 * scaling_factor(4, "none") == pytest.approx(0.001)


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


def run_of(decay, steps: int = 100, **schedule) -> list[float]:
    """Each step's learning rate, one step an epoch (so epochs are steps), no warmup."""
    config = Schedule(epochs=steps, decay=decay, **schedule)
    lr = LearningRateSchedule.from_recipe(config, base=0.1, scale=1, steps_per_epoch=1)
    return [lr(step) for step in range(steps)]


def torch_run(make, steps: int = 100) -> list[float]:
    """The learning rate torch's scheduler `make(optimizer)` gives each of `steps` steps."""
    import torch

    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    scheduler, rates = make(optimizer), []
    for _ in range(steps):
        rates.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return rates


@pytest.mark.parametrize(
    ("decay", "make"),
    [
        ({"type": "step", "every": 30, "gamma": 0.5},
         lambda o: torch.optim.lr_scheduler.StepLR(o, step_size=30, gamma=0.5)),
        ({"type": "multistep", "milestones": [25, 60, 90]},
         lambda o: torch.optim.lr_scheduler.MultiStepLR(o, milestones=[25, 60, 90], gamma=0.1)),
        ({"type": "exponential", "gamma": 0.95},
         lambda o: torch.optim.lr_scheduler.ExponentialLR(o, gamma=0.95)),
        ({"type": "polynomial", "power": 2.0},
         lambda o: torch.optim.lr_scheduler.PolynomialLR(o, total_iters=100, power=2.0)),
        ("linear", lambda o: torch.optim.lr_scheduler.PolynomialLR(o, total_iters=100, power=1)),
        ("one_cycle",
         lambda o: torch.optim.lr_scheduler.OneCycleLR(o, max_lr=0.1, total_steps=100,
                                                       cycle_momentum=False)),
        ({"type": "one_cycle", "pct_start": 0.25, "div_factor": 10, "final_div_factor": 100},
         lambda o: torch.optim.lr_scheduler.OneCycleLR(
             o, max_lr=0.1, total_steps=100, pct_start=0.25, div_factor=10,
             final_div_factor=100, cycle_momentum=False)),
    ],
)  # fmt: skip
def test_each_decay_gives_the_learning_rates_torchs_scheduler_gives(decay, make):
    assert run_of(decay) == pytest.approx(torch_run(make), rel=1e-9, abs=1e-15)


def test_polynomial_ends_at_its_end_factor_and_warmup_comes_first():
    rates = run_of({"type": "polynomial", "end": 0.1}, steps=110, warmup_epochs=10)
    assert rates[:11] == pytest.approx([0.1] * 11)  # scale 1: warmup from 0.1 to 0.1
    assert rates[60] == pytest.approx(0.1 * (0.1 + 0.9 * 0.5))
    assert rates[-1] == pytest.approx(0.1 * (0.1 + 0.9 / 100))


def test_a_recipes_own_decay_gets_the_steps_after_warmup():
    seen = []

    def halve_at_half(step, steps):
        seen.append((step, steps))
        return 1.0 if step < steps // 2 else 0.5

    config = Schedule(epochs=4, warmup_epochs=1, decay=halve_at_half)
    lr = LearningRateSchedule.from_recipe(config, base=0.001, scale=2, steps_per_epoch=100)
    assert [lr(s) for s in (0, 100, 249, 250, 399)] == pytest.approx(
        [0.001, 0.002, 0.002, 0.001, 0.001]
    )
    assert seen == [(0, 300), (149, 300), (150, 300), (299, 300)]
    assert config.table()["decay"].startswith("python function ")


@pytest.mark.parametrize("factor", [-0.5, float("nan"), float("inf"), "1", None])
def test_a_decay_function_that_returns_no_factor_is_one_line(factor):
    config = Schedule(epochs=1, decay=lambda step, steps: factor)
    lr = LearningRateSchedule.from_recipe(config, base=0.1, scale=1, steps_per_epoch=10)
    expected = (r"^schedule.decay: <lambda>\(3, 10\) returned .* at step 3; return a finite "
                r"factor >= 0 of the peak learning rate$")  # fmt: skip
    with pytest.raises(UsageError, match=expected):
        lr(3)


@pytest.mark.parametrize(
    ("decay", "message"),
    [
        ("cosin", "schedule.decay: unknown type 'cosin'; choose one of none, cosine, linear"),
        (3, "schedule.decay: expected a name, a table { type = NAME, ... } or a function"),
        ({"every": 3}, "schedule.decay: expected a name, a table"),
        ("step", 'schedule.decay.every: step needs it; give { type = "step", every = ... }'),
        ({"type": "step", "every": 0}, "schedule.decay.every: 0.0 is out of range"),
        ({"type": "step", "every": 2, "gama": 0.1},
         "schedule.decay: step takes no 'gama'; its parameters: every, gamma"),
        ({"type": "cosine", "end": 0.1},
         "schedule.decay: cosine takes no 'end'; its parameters: none"),
        ({"type": "multistep", "milestones": [60, 30]},
         "schedule.decay.milestones: [60, 30] must rise"),
        ({"type": "multistep", "milestones": 30}, "schedule.decay.milestones: expected a list"),
        ({"type": "exponential", "gamma": -1}, "schedule.decay.gamma: -1.0 is out of range"),
        ({"type": "one_cycle", "pct_start": 1.5}, "schedule.decay.pct_start: 1.5 is out of range"),
    ],
)  # fmt: skip
def test_a_mistaken_decay_is_one_line_when_the_recipe_is_made(decay, message):
    with pytest.raises(UsageError) as error:
        Schedule(decay=decay)
    assert str(error.value).startswith(message) and "\n" not in str(error.value)
