"""The loop at world size 1 (one process, no horovodrun), through a recipe's callback: the
events' order and state against what the run recorded, stops asked for at a step and at an
evaluation, a callback that raises, the validation split, evaluations every N steps and early
stopping. (Two ranks: tests/training/test_stops.py.)"""

import dataclasses
import json
from pathlib import Path
from types import MappingProxyType

import pytest

from hvd_train import Callback, State
from hvd_train.distributed.checkpoint_files import checkpoint_name
from tests.conftest import FRAMEWORKS
from tests.helpers import evaluation, hvd_train
from tests.horovodrun import script

RECIPE = script("events_recipe.py")
STEPS = 12  # per epoch: 384 examples in batches of 32


def train(tmp_path: Path, framework: str, *arguments: str, **env: str):
    """The events recipe trained in one process (resumed, with "--resume" in `arguments`: the
    run's own recipe and framework); its result and each event it saw."""
    out = tmp_path / "run"
    new = () if "--resume" in arguments else ("--recipe", RECIPE, "--framework", framework)
    result = hvd_train(*new, "--output-dir", str(out), "--log-every", "1", *arguments,
                       env={"EVENTS": str(tmp_path / "events"), **env})  # fmt: skip
    lines = (tmp_path / "events.0").read_text().splitlines()
    return result, [json.loads(line) for line in lines]


def records(tmp_path: Path, kind: str) -> list[dict]:
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["kind"] == kind]


def summary(tmp_path: Path) -> dict:
    return json.loads((tmp_path / "run" / "summary.json").read_text())


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_callbacks_see_every_event_in_order_with_the_figures_the_run_records(framework, tmp_path):
    result, events = train(tmp_path, framework)
    assert result.returncode == 0, result.stderr
    epoch = ["on_epoch_start", *["on_step_end"] * STEPS, "on_evaluate", "on_checkpoint",
             "on_epoch_end"]  # fmt: skip
    assert [e["event"] for e in events] == ["on_train_start", *epoch, *epoch, "on_train_end"]
    assert events[0]["model"].startswith("keras" if framework == "tensorflow" else "torch")
    steps = [e for e in events if e["event"] == "on_step_end"]
    assert [e["step"] for e in steps] == list(range(1, 2 * STEPS + 1))
    assert [e["epoch"] for e in steps] == [0] * STEPS + [1] * STEPS
    # Each step's loss and learning rate are those its record holds (--log-every 1).
    trained = records(tmp_path, "train")
    assert [(e["metrics"]["loss"], e["metrics"]["learning_rate"]) for e in steps] == [
        (r["loss"], r["learning_rate"]) for r in trained
    ]
    # Each evaluation's figures are its record's, and the last is the summary's.
    evaluated = [e for e in events if e["event"] == "on_evaluate"]
    assert [e["figures"] for e in evaluated] == [
        {k: v for k, v in r.items() if k.startswith("test_")} for r in records(tmp_path, "eval")
    ]
    assert evaluated[-1]["figures"].items() <= summary(tmp_path).items()
    assert [e["step"] for e in evaluated] == [STEPS, 2 * STEPS]
    # The checkpoint is on disk when its callback runs, and the epoch's end sees the figures.
    saved = [e for e in events if e["event"] == "on_checkpoint"]
    assert [Path(e["path"]).name for e in saved] == [checkpoint_name(1, 0), checkpoint_name(2, 0)]
    assert all(e["saved"] for e in saved)
    end = next(e for e in events if e["event"] == "on_epoch_end")
    assert end["epoch"] == 0 and end["metrics"]["test_loss"] == evaluated[0]["figures"]["test_loss"]
    assert end["metrics"]["loss"] == pytest.approx(
        sum(e["metrics"]["loss"] for e in steps[:STEPS]) / STEPS
    )
    assert summary(tmp_path)["stopped_early"] is False


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_a_stop_asked_at_a_step_ends_training_after_the_next_as_at_its_end(framework, tmp_path):
    result, events = train(tmp_path, framework, "--log-every", "4", STOP="on_step_end:5")
    assert result.returncode == 0, result.stderr
    assert [r["step"] for r in records(tmp_path, "train")] == [4, 6]  # the stop's steps too
    assert [e["event"] for e in events[-5:]] == ["on_step_end", "on_evaluate", "on_checkpoint",
                                                 "on_epoch_end", "on_train_end"]  # fmt: skip
    assert max(e["step"] for e in events) == 6
    run = tmp_path / "run"
    assert [p.name for p in (run / "checkpoints").iterdir()] == [checkpoint_name(0, 6 * 32)]
    figures = summary(tmp_path)
    assert figures["stopped_early"] is True
    # The summary evaluates the weights it stopped with: those of the checkpoint.
    alone = evaluation(run, "--framework", framework)
    assert alone["test_loss"] == pytest.approx(figures["test_loss"], rel=1e-6)


def test_a_stop_asked_at_an_evaluation_ends_training_at_that_epoch(tmp_path):
    result, events = train(tmp_path, "torch", STOP="on_evaluate:-1")
    assert result.returncode == 0, result.stderr
    assert [e["event"] for e in events[-3:]] == ["on_checkpoint", "on_epoch_end", "on_train_end"]
    assert max(e["step"] for e in events) == STEPS
    assert summary(tmp_path)["stopped_early"] is True


@pytest.mark.parametrize(
    ("event", "where", "saved"),
    [("on_step_end", "at step 4 of epoch 1", checkpoint_name(0, 4 * 32)),
     ("on_evaluate", "at the end of epoch 1", checkpoint_name(1, 0)),
     ("on_train_start", "before its first step", checkpoint_name(0, 0))],
)  # fmt: skip
def test_a_callback_that_raises_is_one_line_and_training_resumes_from_its_checkpoint(
    event, where, saved, tmp_path
):
    step = {"on_step_end": 3, "on_evaluate": STEPS, "on_train_start": 0}[event]
    result, _ = train(tmp_path, "torch", RAISE=f"{event}:{step}")
    assert result.returncode == 2
    assert result.stderr.splitlines()[-1] == (
        f"hvd-train: error: callback Events raised ValueError in {event}: asked to raise at "
        f"step {step}; training stopped {where} after saving a checkpoint; fix the callback "
        f"and continue with: hvd-train --resume --output-dir {tmp_path / 'run'}"
    )
    assert saved in [p.name for p in (tmp_path / "run" / "checkpoints").iterdir()]
    again, events = train(tmp_path, "torch", "--resume")
    assert again.returncode == 0, again.stderr
    assert summary(tmp_path)["epochs"] == 2 and events[-1]["step"] == 2 * STEPS


def test_the_state_a_callback_sees_is_read_only():
    asked = []
    state = State(0, 1, 0, 3, MappingProxyType({"loss": 0.5}), None, lambda: asked.append(1))
    with pytest.raises(dataclasses.FrozenInstanceError):
        state.step = 4  # type: ignore[misc]
    with pytest.raises(TypeError):
        state.metrics["loss"] = 0.0  # type: ignore[index]
    state.request_stop()
    assert asked == [1]
    assert Callback().on_step_end(state) is None  # the base class does nothing


def test_a_validation_split_is_evaluated_in_training_and_the_test_set_once_at_the_end(tmp_path):
    result, events = train(tmp_path, "torch", "--set", "data.validation_fraction=0.25",
                           "--set", "schedule.evaluate_every=4")  # fmt: skip
    assert result.returncode == 0, result.stderr
    steps = 9  # per epoch: 288 of the 384 examples train
    assert max(e["step"] for e in events) == 2 * steps
    evaluated = [(e["step"], sorted(e["figures"])) for e in events if e["event"] == "on_evaluate"]
    val, test = ["val_accuracy", "val_loss"], ["test_accuracy", "test_loss"]
    # Every 4 global steps, at each epoch's end, and the test set's once after the last.
    assert evaluated == [(4, val), (8, val), (9, val), (12, val), (16, val), (18, val), (18, test)]
    assert [r["step"] for r in records(tmp_path, "eval")] == [4, 8, 9, 12, 16, 18, 18]
    # The figures at the end are the last checkpoint's on the test set, as eval measures them.
    figures = summary(tmp_path)
    alone = evaluation(tmp_path / "run", "--framework", "torch")
    assert alone["test_loss"] == pytest.approx(figures["test_loss"], rel=1e-6)
    last = [e["figures"] for e in events if e["event"] == "on_evaluate"][-2]
    assert figures["val_loss"] == last["val_loss"] != figures["test_loss"]
    assert "at the end: test loss" in result.stdout


def test_early_stopping_ends_training_when_the_watched_figure_stops_improving(tmp_path):
    # No evaluation improves on the first by 10: with patience 2, the third asks to stop.
    stopping = (
        "schedule.early_stopping={ monitor = 'val_accuracy', mode = 'max', patience = 2, "
        "min_delta = 10.0 }"
    )
    result, events = train(tmp_path, "torch", "--set", "data.validation_fraction=0.25",
                           "--set", "schedule.evaluate_every=3", "--set", stopping)  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "hvd-train: early stopping at step 9: val_accuracy has not improved on " in result.stdout
    assert max(e["step"] for e in events) == 9  # evaluated at 3, 6 and 9, the epoch's end
    assert events[-1]["event"] == "on_train_end" and summary(tmp_path)["stopped_early"] is True


def test_the_best_checkpoints_are_kept_and_eval_takes_the_best(tmp_path):
    settings = ["data.validation_fraction=0.25", "schedule.evaluate_every=3",
                "checkpoints.keep_best=2"]  # fmt: skip
    result, _ = train(tmp_path, "torch", *(f"--set={setting}" for setting in settings))
    assert result.returncode == 0, result.stderr
    figures = {r["step"]: r["val_loss"] for r in records(tmp_path, "eval") if "val_loss" in r}
    assert sorted(figures) == [3, 6, 9, 12, 15, 18]
    two_best = sorted(figures, key=figures.get)[:2]
    best = tmp_path / "run" / "best"
    names = {checkpoint_name(step // 9, 32 * (step % 9)) for step in two_best}
    assert {path.name for path in best.iterdir()} == names
    # The newest checkpoints are kept as before, beside them.
    assert checkpoint_name(2, 0) in [p.name for p in (tmp_path / "run" / "checkpoints").iterdir()]
    chosen = evaluation(best, "--framework", "torch")
    lowest = min(two_best, key=figures.get)
    assert Path(chosen["checkpoint"]).name == checkpoint_name(lowest // 9, 32 * (lowest % 9))


def test_early_stopping_counts_on_across_a_resume(tmp_path):
    # No evaluation improves on the first by 10: with patience 2, the third (epoch 3) asks to
    # stop, in one run as in a run of two epochs resumed for more.
    stopping = "schedule.early_stopping={ patience = 2, min_delta = 10.0 }"
    split = "data.validation_fraction=0.25"
    whole, _ = train(tmp_path / "whole", "torch", "--set", split, "--set", stopping,
                     "--epochs", "5")  # fmt: skip
    assert whole.returncode == 0, whole.stderr
    assert "hvd-train: early stopping at step 27: val_loss has not improved" in whole.stdout
    first, _ = train(tmp_path, "torch", "--set", split, "--set", stopping, "--epochs", "2",
                     KEEP="the first run's")  # fmt: skip
    assert first.returncode == 0 and summary(tmp_path)["stopped_early"] is False, first.stderr
    resumed, events = train(tmp_path, "torch", "--resume", "--epochs", "5")
    assert resumed.returncode == 0, resumed.stderr
    # The recipe's callback took back what it kept, as the early stopping did.
    assert (tmp_path / "events.loaded").read_text() == '{"kept": "the first run\'s"}\n'
    assert "hvd-train: early stopping at step 27: val_loss has not improved" in resumed.stdout
    assert summary(tmp_path)["stopped_early"] is True
    assert events[-1] == {**events[-1], "event": "on_train_end", "step": 27}


def test_a_callback_state_a_checkpoint_cannot_hold_is_one_line(tmp_path):
    result, _ = train(tmp_path, "torch", KEEP="unsaveable")
    assert result.returncode == 2
    assert result.stderr.splitlines()[-1] == (
        "hvd-train: error: callback Events's state_dict() returned what a checkpoint cannot hold "
        "(Object of type object is not JSON serializable); return a dict of numbers, strings, "
        "lists and dicts"
    )


def test_resuming_from_the_best_checkpoint_sets_the_later_ones_aside(tmp_path):
    # The highest validation loss is the best here: the first epoch's, so that two follow it.
    run = tmp_path / "run"
    keep = ["--set", "data.validation_fraction=0.25", "--set", "checkpoints.keep_best=1",
            "--set", "checkpoints.mode='max'"]  # fmt: skip
    result, _ = train(tmp_path, "torch", *keep, "--epochs", "3")
    assert result.returncode == 0, result.stderr
    [best] = (run / "best").iterdir()
    assert best.name == checkpoint_name(1, 0)
    trained = (run / "checkpoints" / checkpoint_name(3, 0) / "model.safetensors").read_bytes()
    records_before = (run / "metrics.jsonl").read_text()

    resumed, _ = train(tmp_path, "torch", "--resume", "best")
    assert resumed.returncode == 0, resumed.stderr
    assert f"hvd-train: resuming from {best}" in resumed.stdout
    [aside] = run.glob("set-aside-*")
    assert f"hvd-train: the checkpoints after it are set aside in {aside}" in resumed.stdout
    assert sorted(p.name for p in (aside / "checkpoints").iterdir()) == [
        checkpoint_name(2, 0),
        checkpoint_name(3, 0),
    ]
    assert (aside / "metrics.jsonl").read_text() == records_before
    # Trained again from the first epoch's end, exactly as the first time.
    again = run / "checkpoints" / checkpoint_name(3, 0) / "model.safetensors"
    assert again.read_bytes() == trained
    assert [r["epoch"] for r in records(tmp_path, "eval")] == [1, 2, 3, 3]

    missing, _ = train(tmp_path / "no-best", "torch", "--epochs", "1")
    assert missing.returncode == 0, missing.stderr
    refused, _ = train(tmp_path / "no-best", "torch", "--resume", "best")
    assert refused.returncode == 2
    assert refused.stderr.strip().endswith(
        "holds no checkpoint (the recipe keeps the best with [checkpoints] keep_best); use "
        "--resume latest"
    )
