"""The framework-neutral training loop, shaped as pytorch/examples' DDP tutorial shapes it:
`run_step`, `run_epoch`, `save_snapshot` (and `resume`), `fit`.

It is handed its collaborators built: the run (the distributed layer and the model), the data,
the records. What happens at its events besides training is its observers' (`observers.py`),
then the recipe's callbacks' (`callbacks.py`), which it calls alike. It is the distributed
layer's first user, as a loop of one's own is: its batches come from the layer's loader, its
steps from the exchange, its checkpoints go through the layer's one checkpoint path
(`hvd_train.distributed`). Rank 0 alone writes files and shows progress; every rank runs the
same steps and collectives, and stops at the same step.
"""

from __future__ import annotations

import json
import math
import signal
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import closing
from types import MappingProxyType
from typing import Any

import numpy as np
from tqdm import tqdm

from hvd_train.callbacks import Callback, State
from hvd_train.data import Splits, batch_size
from hvd_train.distributed import Best, ElasticState, Found, StepResult
from hvd_train.errors import Stopped, UsageError
from hvd_train.recipe.learning_rate import LearningRateSchedule
from hvd_train.training.evaluation import evaluate
from hvd_train.training.metrics import MetricsWriter, write_error
from hvd_train.training.observers import loop_observers
from hvd_train.training.options import RunOptions
from hvd_train.training.position import EpochPlan, Position
from hvd_train.training.resume import check_continues, check_layout
from hvd_train.training.run import Run
from hvd_train.training.stopping import StopRequests
from hvd_train.training.throughput import Throughput
from hvd_train.version import __version__

# What a resumed run's line says where its checkpoint does not fit the recipe's model.
RESUME_REMEDY = "resume with that recipe or choose another --output-dir"


class Trainer:
    def __init__(self, run: Run, data: Splits, options: RunOptions,
                 records: MetricsWriter) -> None:  # fmt: skip
        self.run, self.data, self.options = run, data, options
        self.dist, self.recipe = run.dist, run.recipe
        self.records = records
        assert options.output_dir is not None and options.seed is not None, "decided by now"
        self.output_dir, self.seed = options.output_dir, options.seed
        self.throughput = Throughput()
        self.elastic_state: ElasticState | None = None
        self.requests = StopRequests()
        self.epoch, self.position = 0, Position(0, 0)  # the epoch under way, the step done
        self.saved: Position | None = None  # where the last checkpoint was
        names = ["loss", *self.recipe.metric_functions]
        self.tested = {f"test_{name}": float("nan") for name in names}  # the last evaluations
        self.validated: dict[str, float] = {}
        self.figures: dict[str, float] = {}  # the latest, as callbacks see them
        self.observers = loop_observers(self, options)
        self.callbacks = list(self.recipe.callbacks)
        self.resize()

    def resize(self) -> None:
        """What follows from the world size and this rank: the loader (every rank takes a new
        slice of the examples), steps per epoch, global batch, learning rate, and who writes
        the records. Called again when an elastic job resizes (rank 0 may then be another
        process)."""
        dist, recipe, loading = self.dist, self.recipe, self.recipe.loading
        self.records.enabled = dist.is_rank_zero
        passes = recipe.horovod.backward_passes_per_step
        self.loader = dist.loader(
            self.data.train, recipe.schedule.batch_size, seed=self.seed, workers=loading.workers,
            prefetch=loading.prefetch, transforms=recipe.transforms(), timeout=loading.timeout,
            passes=passes, limit=self.options.limit_steps,
        )  # fmt: skip
        self.plan = EpochPlan(len(self.loader), self.loader.global_batch)
        self.schedule = LearningRateSchedule.from_recipe(
            recipe.schedule, dist.learning_rate, dist.world_size * passes,
            self.plan.steps_per_epoch,
        )  # fmt: skip

    @property
    def workers(self) -> int:
        """The data workers that read the training batches ahead."""
        return self.loader.workers

    def examples(self, position: Position) -> int:
        """Training examples seen since the run began, whatever the world size: the position
        that metrics records carry."""
        size = len(self.data.train)
        return position.epoch * size + min(self.plan.samples(position), size)

    def run_step(self, batches: Iterator[list[tuple[Any, Any]]], index: int,
                 step: int) -> StepResult:  # fmt: skip
        """Step `index` of the epoch (global step `step`) on this rank's next batches (one per
        backward pass); the wait for them is the step's T_data."""
        dist = self.dist
        started = time.perf_counter()
        taken = next(batches)
        waited = time.perf_counter() - started
        if self.records.failure:
            self.requests.failure = self.records.failure
        result = dist.exchange.step(taken, self.schedule(step), self.loader.step_seed(index),
                                    self.requests.flags())  # fmt: skip
        images = sum(batch_size(x) for x, _ in taken) * dist.world_size
        self.throughput.add(images, time.perf_counter() - started, result, waited)
        return result

    def run_epoch(self, epoch: int, first_step: int) -> bool:
        """Trains epoch `epoch` from `first_step` on, then evaluates; whether training goes on
        (no callback asked it to stop)."""
        steps = self.plan.steps_per_epoch
        self.epoch, self.position = epoch, Position(epoch, first_step)
        self.notify("on_epoch_start")
        losses, asked = [], False
        self.loader.set_epoch(epoch, first_step)
        with closing(self.loader.step_batches()) as batches:
            for index in range(first_step, steps):
                step = self.plan.global_step(Position(epoch, index))
                result = self.run_step(batches, index, step)
                self.position = Position(epoch, index + 1)
                asked = self.check_step(result)
                losses.append(result.loss)
                self.figures.update(loss=result.loss, learning_rate=self.schedule(step))
                self.notify("on_step_end")
                if asked:
                    break
                if self.evaluates_within(step + 1, index + 1):
                    self.evaluate(self.evaluated_split)
        self.end_epoch(float(np.mean(losses)) if losses else float("nan"))
        return not (asked or self.gather_stops(self.requests.callback_flags()))

    def end_epoch(self, train_loss: float) -> None:
        """The epoch's end (or a stop's, part way through it): the evaluation, then the
        observers (the replica check, the checkpoint, ...) and the callbacks."""
        if self.position.step == self.plan.steps_per_epoch:
            self.position = Position(self.epoch + 1, 0)
        self.figures["loss"] = train_loss
        self.evaluate(self.evaluated_split)
        self.notify("on_epoch_end")

    def evaluates_within(self, global_step: int, step: int) -> bool:
        """Whether `[schedule] evaluate_every` asks for an evaluation after `global_step`, one
        that is not at its epoch's end (which evaluates anyway)."""
        every = self.recipe.schedule.evaluate_every
        return bool(every) and global_step % every == 0 and step < self.plan.steps_per_epoch

    @property
    def evaluated_split(self) -> str:
        """What the evaluations during training measure: the validation split where the recipe
        sets one aside (the test set is then evaluated once, at the end), else the test set."""
        return "val" if self.data.validation is not None else "test"

    def evaluate(self, split: str) -> None:
        """The loss and metrics on `split` ("val" or "test"), as `<split>_<name>`, handed to
        the observers and callbacks."""
        dataset = self.data.validation if split == "val" else self.data.test
        assert dataset is not None, "evaluated_split says which there is"
        results = evaluate(self.dist, dataset, self.recipe.metric_functions)
        figures = {f"{split}_{name}": value for name, value in results.items()}
        if split == "test":
            self.tested = figures
        else:
            self.validated = figures
        self.figures.update(figures)
        self.notify("on_evaluate", MappingProxyType(figures))

    def check_step(self, result: StepResult) -> bool:
        """Stops every rank, at the same step, when the step's numbers are not finite or any
        rank asked to stop; the numbers are the same on every rank, so all decide alike.
        Whether a callback asked for the stop (training then ends as at its last step)."""
        if not (math.isfinite(result.loss) and result.gradients_finite):
            what = "loss" if not math.isfinite(result.loss) else "gradient norm"
            value = result.loss if what == "loss" else result.gradient_norm
            raise UsageError(
                f"the {what} became {value} {self.where()}, and "
                "training stopped before saving anything after it; lower the learning rate "
                "(--lr) or clip the gradients (--set optimizer.gradient_clip_norm=1.0), and "
                "continue from the newest checkpoint with --resume",
                every_rank=True,
            )
        return bool(result.carried.any()) and self.stop()

    def gather_stops(self, flags: np.ndarray) -> bool:
        """Where no step follows to carry them: `flags` summed over the ranks at once, and
        acted on; whether a callback asked to stop."""
        return bool(self.dist.all_reduce(flags, op="sum").any()) and self.stop()

    def stop(self) -> bool:
        """Acts on the stops that some rank asked for, on every rank together: a failed write
        ends the job with its message; a callback that raised, or a signal, with a checkpoint
        here and how to resume. True when only a callback's request is left."""
        everyone = self.dist.all_gather(self.requests.reasons())
        failures, errors, signals, asked = ([reasons[k] for reasons in everyone] for k in range(4))
        if any(failures):
            raise UsageError(next(f for f in failures if f), every_rank=True)
        if (any(errors) or any(signals)) and self.saved != self.position:
            self.save_snapshot(self.position)
        resume = f"continue with: hvd-train --resume --output-dir {self.output_dir}"
        where = self.where()
        if any(errors):
            rank, error = next((rank, e) for rank, e in enumerate(errors) if e)
            on_rank = f"rank {rank}: " if self.dist.world_size > 1 else ""
            raise UsageError(
                f"{on_rank}{error}; training stopped {where} after saving a checkpoint; fix "
                f"the callback and {resume}",
                every_rank=True,
            )
        if any(signals):
            signum = next(s for s in signals if s)
            name = signal.Signals(signum).name
            message = f"stopped by {name} {where}, after saving a checkpoint; {resume}"
            if self.dist.is_rank_zero:
                tqdm.write(f"hvd-train: {message}")
            raise Stopped(signum, message)
        return any(asked)

    def where(self) -> str:
        """`at step 3 of epoch 2`, `at the end of epoch 1`: the position in a message."""
        if self.position == Position(0, 0):
            return "before its first step"
        if self.position.step == 0:
            return f"at the end of epoch {self.position.epoch}"
        return f"at step {self.position.step} of epoch {self.position.epoch + 1}"

    def notify(self, event: str, *details: Any) -> None:
        """Calls `event` of the loop's observers, then of the recipe's callbacks. A callback
        that raises does not stop this rank at once (the others would wait for it in the next
        collective): its error becomes a stop request, which every rank acts on together."""
        state = State(self.dist.rank, self.dist.world_size, self.epoch,
                      self.plan.global_step(self.position), MappingProxyType(dict(self.figures)),
                      self.run.model, self.ask_to_stop)  # fmt: skip
        for observer in self.observers:
            getattr(observer, event)(state, *details)
        for callback in self.callbacks:
            try:
                getattr(callback, event)(state, *details)
            except Exception as error:
                if self.requests.error is None:
                    text = next(iter(str(error).splitlines()), "")
                    name = type(callback).__name__
                    self.requests.error = (
                        f"callback {name} raised {type(error).__name__} in {event}: {text}"
                    )

    def ask_to_stop(self) -> None:
        self.requests.asked = True

    def keyed_callbacks(self) -> Iterator[tuple[str, Callback]]:
        """The observers and callbacks by the names their kept state is saved under: the class
        name, numbered from the second of a class on."""
        seen: Counter[str] = Counter()
        for callback in [*self.observers, *self.callbacks]:
            name = type(callback).__name__
            seen[name] += 1
            yield (name if seen[name] == 1 else f"{name}#{seen[name]}"), callback

    def callback_states(self) -> dict[str, Any]:
        """What the observers and callbacks keep across a resume, by their names."""
        states = {}
        for key, callback in self.keyed_callbacks():
            state = callback.state_dict()
            try:
                json.dumps(state, allow_nan=False)
            except (TypeError, ValueError) as error:
                raise UsageError(
                    f"callback {key}'s state_dict() returned what a checkpoint cannot hold "
                    f"({error}); return a dict of numbers, strings, lists and dicts"
                ) from None
            if state:
                states[key] = state
        return states

    def saved_values(self, position: Position) -> dict[str, Any]:
        """What a checkpoint of `position` holds beside the tensors: the model and optimizer
        `setup` returned, where the run stands and what shaped it, and what the observers and
        callbacks keep (rank 0's, which every rank takes back on resuming)."""
        exchange = self.dist.exchange
        return {
            "model": exchange.model,
            "optimizer": exchange.optimizer,
            "epoch": position.epoch,
            "step": position.step,
            "global_step": self.plan.global_step(position),
            "seed": self.seed,
            "limit_steps": self.options.limit_steps,
            "learning_rate": {
                "base": self.schedule.base,
                "peak": self.schedule.peak,
                "scaling": self.recipe.schedule.lr_scaling,
            },
            "callbacks": self.dist.broadcast(self.callback_states()),
        }

    def save_snapshot(self, position: Position) -> None:
        """Saves a checkpoint of `position` (rank 0 writes); every rank's observers and
        callbacks are told where. A failed write stops every rank with its message."""
        path = self.dist.checkpoints.save(self.output_dir, self.saved_values(position),
                                          recipe=self.recipe,
                                          keep=self.options.keep_checkpoints)  # fmt: skip
        self.saved = position
        self.notify("on_checkpoint", path)

    def save_if_best(self, position: Position, figure: float) -> None:
        """Saves a checkpoint of `position` into the run's best/ if `figure` (of the recipe's
        watched metric) ranks among the best kept there; if it did, every rank is told where."""
        if not math.isfinite(figure):
            return
        kept = self.recipe.checkpoints
        best = Best(kept.monitor, figure, kept.mode, kept.keep_best)
        path = self.dist.checkpoints.save(self.output_dir, self.saved_values(position),
                                          recipe=self.recipe, best=best)  # fmt: skip
        if path is not None:
            self.notify("on_checkpoint", path)

    def resume(self, found: Found, broadcast: bool = True) -> Position:
        """Every rank: the model and optimizer take `found`'s state (rank 0 loads it; every
        rank's where `broadcast`, else the elastic state's sync hands it out), and the
        observers and callbacks take back the state they kept in it; records after it are
        dropped, to be made anew, and from one of the best checkpoints, the run's later
        checkpoints are set aside first. Where training goes on."""
        dist, state = self.dist, found.state
        position = self.plan.position_at(state["epoch"], state["samples_in_epoch"])
        check_layout(found, dist.framework, self.run.layout.name)
        check_continues(found, dist.framework, position, self.recipe.schedule.epochs,
                        self.output_dir)  # fmt: skip
        dist.checkpoints.load(found, remedy=RESUME_REMEDY, broadcast=broadcast)
        dist.print(f"hvd-train: resuming from {found.path}")
        aside = dist.checkpoints.set_aside_after(found)
        if aside is not None:
            dist.print(f"hvd-train: the checkpoints after it are set aside in {aside}")
        dist.on_rank_zero(lambda: self.records.keep_until(self.examples(position)))
        states = found.values.get("callbacks", {})
        for key, callback in self.keyed_callbacks():
            if key in states:
                callback.load_state_dict(states[key])
        return position

    def commit(self, position: Position) -> None:
        """Records `position` with the model in the elastic state: a failure rolls back to here."""
        assert self.elastic_state is not None
        self.elastic_state.epoch = position.epoch
        self.elastic_state.samples = self.plan.samples(position)
        self.elastic_state.commit()

    def fit(self, start: Position) -> dict[str, Any]:
        """Trains from `start` to the recipe's last epoch, or to a stop that a callback or
        early stopping asked for; with a validation split, evaluates the test set at the end.
        The run's summary."""
        started = time.perf_counter()
        self.epoch, self.position = start.epoch, start
        with self.requests.catching_signals():
            self.notify("on_train_start")
            going = not self.gather_stops(self.requests.callback_flags())
            for epoch in range(start.epoch, self.recipe.schedule.epochs):
                if not going:
                    break
                going = self.run_epoch(epoch, start.step if epoch == start.epoch else 0)
            if self.data.validation is not None and self.position != start:
                self.evaluate("test")
            self.notify("on_train_end")
            self.gather_stops(self.requests.callback_flags() * [0, 0, 1, 0])
        self.records.close()
        return self.summary(time.perf_counter() - started, stopped=not going)

    def fit_elastic(self, begin: Callable[[], Position]) -> dict[str, Any]:
        """`fit` under Horovod's elastic driver. The job's first pass through the loop calls
        `begin` (on every rank together) for where to start; after a resize the job goes on
        from the last commit, with slices, step counts and learning rate recomputed for the new
        world size."""

        def loop(state: ElasticState) -> dict[str, Any]:
            self.elastic_state = state
            self.resize()
            if not state.started:
                start = begin()  # rank 0's model, optimizer and position, resumed or fresh...
                state.epoch, state.samples = start.epoch, self.plan.samples(start)
                state.started = True
                state.save()
                state.sync()  # ...on every rank
            position = self.plan.position_at(state.epoch, state.samples)
            # Rank 0 may be new, on another host: give it the run's folder, without the records
            # of steps after the commit that the job went back to.
            self.dist.on_rank_zero(lambda: self.reopen_output(position))
            return self.fit(position)

        return self.dist.exchange.run_elastic(loop)

    def reopen_output(self, position: Position) -> None:
        """A new rank 0 (perhaps on another host) takes over the run's folder and records,
        without those after `position`."""
        try:
            (self.output_dir / "checkpoints").mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise UsageError(write_error(self.output_dir / "checkpoints", error)) from None
        self.records.keep_until(self.examples(position))

    def summary(self, seconds: float, stopped: bool) -> dict[str, Any]:
        dist, recipe = self.dist, self.recipe
        return {
            "recipe": recipe.name,
            "framework": dist.framework,
            "world_size": dist.world_size,
            "epochs": recipe.schedule.epochs,
            "global_batch_size": self.plan.global_batch,
            "learning_rate": self.schedule.peak,
            **self.tested,
            **self.validated,
            "stopped_early": stopped,  # by a callback or early stopping
            "train_seconds": round(seconds, 2),
            **self.throughput.figures(),
            "hosts": dict(Counter(dist.all_gather(dist.host))),
            "hvd_train_version": __version__,
            "settings": recipe.settings_table(),  # the effective recipe
        }
