"""The loop's observers in this process, against a loop that only records what they ask of it:
when checkpoints and elastic commits are taken, and when early stopping asks to stop. (Under
the real loop: tests/training/test_loop.py.)"""

from types import MappingProxyType, SimpleNamespace

import pytest

from hvd_train.callbacks import State
from hvd_train.training.observers import EarlyStopping, ElasticCommits, NewestCheckpoints
from hvd_train.training.position import EpochPlan, Position


class Loop(SimpleNamespace):
    """What an observer reads of the loop, recording the checkpoints and commits it asks for."""

    def __init__(self, steps: int = 10) -> None:
        super().__init__(plan=EpochPlan(steps, 64), position=Position(0, 0), saved=[],
                         committed=[], elastic_state=object(),
                         dist=SimpleNamespace(is_rank_zero=False))  # fmt: skip

    def save_snapshot(self, position: Position) -> None:
        self.saved.append(position)

    def commit(self, position: Position) -> None:
        self.committed.append(position)


def state(loop: Loop, asked: list | None = None) -> State:
    step = loop.plan.global_step(loop.position)
    stop = (lambda: asked.append(step)) if asked is not None else (lambda: None)
    return State(0, 1, loop.position.epoch, step, MappingProxyType({}), None, stop)


def steps(loop: Loop, observer, epochs: int) -> None:
    """`epochs` epochs of the loop's steps, each step's end and each epoch's end told."""
    for epoch in range(epochs):
        for step in range(1, loop.plan.steps_per_epoch + 1):
            loop.position = Position(epoch, step)
            observer.on_step_end(state(loop))
        loop.position = Position(epoch + 1, 0)
        observer.on_epoch_end(state(loop))


def test_checkpoints_every_n_global_steps_and_at_each_epochs_end():
    loop = Loop(steps=10)
    steps(loop, NewestCheckpoints(loop, every=4), epochs=2)
    # Global steps 4 and 8, then 12 and 16 (2 and 6 into epoch 2); step 20 is an epoch's end.
    assert loop.saved == [Position(0, 4), Position(0, 8), Position(1, 0), Position(1, 2),
                          Position(1, 6), Position(2, 0)]  # fmt: skip
    loop = Loop(steps=10)
    steps(loop, NewestCheckpoints(loop, every=None), epochs=2)
    assert loop.saved == [Position(1, 0), Position(2, 0)]


def test_elastic_commits_every_n_steps_and_at_each_epochs_end_only_under_the_driver():
    loop = Loop(steps=5)
    steps(loop, ElasticCommits(loop, every=3), epochs=1)
    assert loop.committed == [Position(0, 3), Position(1, 0)]
    loop.elastic_state, loop.committed = None, []
    steps(loop, ElasticCommits(loop, every=3), epochs=1)
    assert loop.committed == []


@pytest.mark.parametrize(
    ("mode", "min_delta", "figures", "stops_at"),
    [
        ("min", 0.0, [0.5, 0.4, 0.41, 0.42, 0.3], 4),  # no better than 0.4 twice: the 4th
        ("min", 0.0, [0.5, 0.4, 0.41, 0.3, 0.31, 0.32], 6),  # a new best restarts the count
        ("min", 0.05, [0.5, 0.47, 0.46, 0.43], 3),  # better, but not by more than 0.05
        ("max", 0.0, [0.90, 0.95, 0.95, 0.94], 4),  # accuracy: up is better; equal is not
        ("max", 0.0, [0.90, 0.95, 0.96, 0.97], None),
    ],
)  # fmt: skip
def test_early_stopping_asks_at_the_evaluation_that_exhausts_its_patience(
    mode, min_delta, figures, stops_at
):
    loop, asked = Loop(), []
    stopping = EarlyStopping(loop, "val_x", patience=2, mode=mode, min_delta=min_delta)
    for evaluation, figure in enumerate(figures, start=1):
        loop.position = Position(0, evaluation)
        stopping.on_evaluate(state(loop, asked), MappingProxyType({"val_x": figure}))
        # The test set's evaluation at the end carries no val_ figure: it is not counted.
        stopping.on_evaluate(state(loop, asked), MappingProxyType({"test_x": 0.0}))
    assert asked == ([] if stops_at is None else [stops_at])
