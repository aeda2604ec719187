"""A small Python recipe whose callback writes each event as its rank sees it to
`$EVENTS.<rank>` (JSON lines). `$STOP` (`event:step[:rank]`) makes it ask for a stop there,
and `$RAISE` the same way makes it raise; a step of -1 matches any, no rank every rank.
`$KEEP` is what it keeps across a resume (`state_dict`; "unsaveable": an object JSON cannot
hold), and what a resumed run hands back is written to `$EVENTS.loaded`. For
tests/test_callbacks.py and the two-rank stops in tests/training/test_stops.py."""

import json
import os
from pathlib import Path

import numpy as np

from hvd_train import Callback, Recipe, Schedule


def data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(512, 8)).astype(np.float32)
    y = (x[:, 0] + x[:, 1] > 0).astype(np.int64)
    return (x[:384], y[:384]), (x[384:], y[384:])


def torch_model():
    import torch

    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))


def keras_model():
    import keras

    return keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                             keras.layers.Dense(2)])  # fmt: skip


def matches(variable: str, event: str, state) -> bool:
    """Whether `$variable` (event:step[:rank]) names this event, at this step, on this rank."""
    wanted = os.environ.get(variable, "").split(":")
    if wanted[0] != event or int(wanted[1]) not in (-1, state.step):
        return False
    return len(wanted) < 3 or int(wanted[2]) == state.rank


class Events(Callback):
    def write(self, event: str, state, **details) -> None:
        if matches("STOP", event, state):
            state.request_stop()
        if matches("RAISE", event, state):
            raise ValueError(f"asked to raise at step {state.step}\nsecond line")
        record = {"event": event, "epoch": state.epoch, "step": state.step,
                  "metrics": dict(state.metrics), **details}  # fmt: skip
        with open(f"{os.environ['EVENTS']}.{state.rank}", "a") as out:
            out.write(json.dumps(record) + "\n")

    def on_train_start(self, state):
        self.write("on_train_start", state, model=type(state.model).__module__)

    def on_epoch_start(self, state):
        self.write("on_epoch_start", state)

    def on_step_end(self, state):
        self.write("on_step_end", state)

    def on_evaluate(self, state, metrics):
        self.write("on_evaluate", state, figures=dict(metrics))

    def on_checkpoint(self, state, path):
        self.write("on_checkpoint", state, path=str(path), saved=Path(path).is_dir())

    def on_epoch_end(self, state):
        self.write("on_epoch_end", state)

    def on_train_end(self, state):
        self.write("on_train_end", state)

    def state_dict(self):
        kept = os.environ.get("KEEP", "")
        if kept == "unsaveable":
            return {"kept": object()}
        return {"kept": kept} if kept else {}

    def load_state_dict(self, state):
        with open(f"{os.environ['EVENTS']}.loaded", "a") as out:
            out.write(json.dumps(state) + "\n")


recipe = Recipe(data=data, torch_model=torch_model, keras_model=keras_model,
                schedule=Schedule(epochs=2, batch_size=32), callbacks=[Events()])  # fmt: skip
