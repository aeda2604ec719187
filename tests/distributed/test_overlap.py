"""How gradients are cut into buckets, and how "auto" decides to overlap the exchange with the
backward pass: from the rank-averaged times the steps carry."""

import numpy as np
import pytest

from hvd_train.distributed.overlap import TRIAL_STEPS, OverlapChoice, buckets
from hvd_train.errors import UsageError
from hvd_train.recipe import ExchangeSettings

MB = 2**20


def test_buckets_follow_the_backward_pass_and_close_at_the_limit():
    sizes = [1 * MB, 3 * MB, 1 * MB, 9 * MB, 1 * MB]  # in the model's order
    assert buckets(sizes, limit=4 * MB) == [[4, 3], [2, 1], [0]]
    assert buckets(sizes, limit=100 * MB) == [[4, 3, 2, 1, 0]]
    assert buckets([10], limit=4 * MB) == [[0]]


def run(choice: OverlapChoice, steps: int, compute: float, sync: float) -> list[bool]:
    """The choice before each of `steps` steps whose times are all (compute, sync), on each
    of two ranks alike: what travels is this rank's last times, which come back averaged."""
    seen = []
    for _ in range(steps):
        seen.append(choice.overlap)
        sent = choice.last.copy()
        choice.record(compute, sync, averaged=sent)
    return seen


def test_auto_overlaps_after_its_trial_where_the_exchange_kept_the_step_waiting():
    seen = run(OverlapChoice("auto", bucket_count=3), TRIAL_STEPS + 4, compute=1.0, sync=0.3)
    assert seen == [False] * (TRIAL_STEPS + 2) + [True] * 2


def test_auto_keeps_one_group_where_the_exchange_was_short_or_the_gradients_one_bucket():
    assert not any(run(OverlapChoice("auto", 3), TRIAL_STEPS + 4, compute=1.0, sync=0.05))
    assert not any(run(OverlapChoice("auto", 1), TRIAL_STEPS + 4, compute=1.0, sync=0.9))


def test_the_setting_overrides_the_measurement():
    assert all(run(OverlapChoice(True, 3), 8, compute=1.0, sync=0.0))
    assert not any(run(OverlapChoice(False, 3), 8, compute=1.0, sync=0.9))


@pytest.mark.parametrize("value", ["yes", 1, 0, None])
def test_overlap_accepts_true_false_or_auto_only(value):
    with pytest.raises(UsageError, match=r"horovod.overlap: unknown value .*true, false"):
        ExchangeSettings(overlap=value)


def test_every_rank_decides_on_the_times_averaged_over_the_ranks():
    choice = OverlapChoice("auto", bucket_count=3)
    for _ in range(TRIAL_STEPS + 2):  # this rank never waited; the other waited long
        choice.record(1.0, 0.0, averaged=np.array([1.0, 0.3]))
    assert choice.overlap


def test_a_restart_decides_anew_as_a_worker_that_just_joined_does():
    joined, veteran = OverlapChoice("auto", 3), OverlapChoice("auto", 3)
    run(veteran, TRIAL_STEPS + 2, compute=1.0, sync=0.3)
    assert veteran.overlap and not joined.overlap
    veteran.restart()  # an elastic reset, on every worker
    assert run(veteran, 3, 1.0, 0.3) == run(joined, 3, 1.0, 0.3) == [False] * 3
