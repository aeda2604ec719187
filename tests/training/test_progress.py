from hvd_train.training import progress
from hvd_train.training.progress import EpochProgress


def lines(capsys) -> list[str]:
    return capsys.readouterr().err.splitlines()


def test_plain_lines_come_with_new_figures_never_repeating_them(capsys):
    bar = EpochProgress("epoch 1/1", 0, 20, enabled=True)  # a tenth: 2 steps
    for step in range(1, 21):
        if step % 5 == 0:  # --log-every 5
            bar.show(loss=f"0.{step}")
        bar.step(step)
    assert lines(capsys) == [f"epoch 1/1: step {s}/20, loss 0.{s}" for s in (5, 10, 15, 20)]


def test_a_line_is_at_most_a_tenth_of_the_epoch_after_the_last(capsys):
    bar = EpochProgress("epoch 1/1", 0, 100, enabled=True)
    for step in range(1, 31):
        bar.show(loss=f"{step}")  # a record every step
        bar.step(step)
    assert [line.split(",")[0] for line in lines(capsys)] == [
        f"epoch 1/1: step {s}/100" for s in (10, 20, 30)
    ]


def test_after_a_minute_without_a_record_the_step_alone(capsys, monkeypatch):
    monkeypatch.setattr(progress, "LINE_SECONDS", 0.0)
    bar = EpochProgress("epoch 1/1", 0, 100, enabled=True)
    bar.step(1)
    bar.show(loss="0.5")
    bar.step(2)
    bar.step(3)
    assert lines(capsys) == ["epoch 1/1: step 1/100", "epoch 1/1: step 2/100, loss 0.5",
                             "epoch 1/1: step 3/100"]  # fmt: skip


def test_other_ranks_print_nothing(capsys):
    bar = EpochProgress("epoch 1/1", 0, 10, enabled=False)
    for step in range(1, 11):
        bar.show(loss="0.5")
        bar.step(step)
    assert lines(capsys) == []
