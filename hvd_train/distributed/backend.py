"""The interface every framework adapter implements; the training loop sees only this.

An adapter does not decide what to train: `setup` is handed a built model, the optimizer's
settings, the loss and Horovod's settings, as Lightning Fabric's strategies are handed a module.
The object collectives are written once here, over the binding's `hvd` module.
"""

from __future__ import annotations

import ctypes
import dataclasses
import math
import os
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, ClassVar, Protocol, TypeVar, runtime_checkable

import numpy as np

from hvd_train.checkpoint import Arrays
from hvd_train.errors import UsageError
from hvd_train.recipe.settings import Horovod, Optimizer

T = TypeVar("T")
# The name of every object broadcast and allgather. Horovod matches collectives across ranks by
# name, and its object collectives default to the object's type name: ranks that pass None and a
# string (a failure on one rank only) would wait for each other for ever.
OBJECT_COLLECTIVE = "hvd_train.object"
# Horovod settings hvd_train applies where the environment gives none. A cycle of 3 ms instead of
# Horovod's 1 ms: where every cycle is a negotiation round of all ranks (MPI; Gloo while a tensor
# waits for a slower rank), fewer rounds leave more of shared cores to the computation. How it
# was measured: docs/history.md, "Speed".
HOROVOD_DEFAULTS = {"HOROVOD_CYCLE_TIME": "3"}
# glibc malloc's parameters (malloc.h's M_TRIM_THRESHOLD and M_MMAP_THRESHOLD) and what
# `keep_freed_memory` sets them to: the largest threshold glibc would move its own to, and four
# times it kept free before memory goes back to the system.
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
MMAP_THRESHOLD_BYTES = 32 * 2**20
TRIM_THRESHOLD_BYTES = 128 * 2**20
Batch = tuple[np.ndarray, Any]  # inputs and labels (an array, or a tuple of them), from `take`
# Where an export went, the exported model's outputs on the examples, and the same from the
# written file loaded back (None where the runtime that loads it is not installed).
Exported = tuple[Path, np.ndarray, np.ndarray | None]
Loss = str | Callable[[Any, Any], Any]  # "cross_entropy", or (outputs, labels) -> mean loss


# Gradients travel in buckets of about this size when they overlap the backward pass, so that
# the bucket the pass finishes last is small. How it was chosen: docs/history.md, "Overlap and
# models of real size".
BUCKET_BYTES = 4 * 2**20
# "auto" times this many steps (after the first, which warms up) with the exchange after the
# pass, then overlaps if the wait for it was at least SYNC_SHARE of the passes' time.
TRIAL_STEPS, SYNC_SHARE = 4, 0.1


def buckets(sizes: list[int], limit: int = BUCKET_BYTES) -> list[list[int]]:
    """The gradients' indices in the order the backward pass makes them (the last layers'
    first), in buckets closed as they reach `limit` bytes."""
    groups: list[list[int]] = [[]]
    filled = 0
    for index in reversed(range(len(sizes))):
        if filled >= limit:
            groups.append([])
            filled = 0
        groups[-1].append(index)
        filled += sizes[index]
    return groups


class OverlapChoice:
    """Whether a step's gradients travel in buckets while its last backward pass goes on
    (overlap), or in one group after it: the recipe's `[horovod] overlap`, or, for "auto",
    decided from the first steps' own times. Each step carries the last step's times (T_comp,
    T_sync) in its exchange, so every rank decides on the same, rank-averaged figures. Overlap
    needs more than one bucket, and it costs cores the pass could use, so "auto" takes it only
    where the exchange kept the step waiting."""

    def __init__(self, setting: bool | str, bucket_count: int) -> None:
        self.setting, self.bucket_count = setting, bucket_count
        self.restart()

    def restart(self) -> None:
        """Back to the first step's choice, on every rank at once (after an elastic reset), so
        that a worker that just joined decides with the others: ranks that sent their
        gradients in different groups would wait for each other for ever."""
        self.overlap = self.setting is True and self.bucket_count > 1
        self.deciding = self.setting == "auto" and self.bucket_count > 1
        self.steps, self.times = 0, np.zeros(2)
        self.last = np.zeros(2)  # this rank's T_comp and T_sync in the step just taken

    def flags(self, flags: np.ndarray) -> np.ndarray:
        """The step's flags, with the last step's times for the others to see."""
        return np.concatenate([np.asarray(flags, np.float64), self.last])

    def record(self, result: StepResult, world_size: int) -> StepResult:
        """Takes the rank-averaged times out of `result` (decides, once enough are in) and
        returns the result as the step's caller knows it."""
        self.last = np.array([result.compute_seconds, result.sync_seconds])
        averaged = result.flags[-2:] / world_size
        if self.deciding:
            self.steps += 1
            if self.steps > 2:  # the first step warms up; the second carries its times
                self.times += averaged
            if self.steps == TRIAL_STEPS + 2:
                compute, sync = self.times
                self.overlap, self.deciding = bool(sync >= SYNC_SHARE * compute), False
        return dataclasses.replace(result, flags=result.flags[:-2])


@dataclass(frozen=True)
class StepResult:
    """What one training step tells every rank, all from the allreduce that averages the
    gradients (no collective of its own)."""

    loss: float  # the step's loss, averaged over its batches and over the ranks
    gradient_norm: float  # the norm of the averaged gradients, before any clipping
    flags: np.ndarray  # the flags each rank gave the step, summed over the ranks
    compute_seconds: float  # this rank's forward and backward passes (T_comp)
    sync_seconds: float  # its wait for the exchange after them, what they did not hide (T_sync)
    # The last pass's time from its first full bucket of gradients to its end: how long a
    # transfer could hide behind it (T_hide; 0 where the gradients make one bucket).
    hide_seconds: float


class ElasticState(Protocol):
    """What the training loop keeps in Horovod's elastic state: where it stands, and commit()
    to save it (and learn of added or removed workers)."""

    epoch: int
    samples: int  # training samples consumed in `epoch`, across all ranks
    started: bool  # whether the job has begun (a joining worker finds it has)

    def commit(self) -> None: ...

    def save(self) -> None: ...

    def sync(self) -> None: ...


@runtime_checkable
class Elastic(Protocol):
    """An adapter that can run under Horovod's elastic driver."""

    def run_elastic(self, loop: Callable[[ElasticState], T]) -> T:
        """Runs `loop` under Horovod's elastic driver: when workers leave or join, the state is
        restored to its last commit, Horovod re-initialises, and `loop` is called again."""


@dataclass(frozen=True)
class ModelState:
    """A rank's model and optimizer, as the framework names and shapes them (a model's `Layout`
    converts the weights for checkpoints)."""

    weights: Arrays  # every weight and running statistic (batchnorm's)
    trained: tuple[str, ...]  # the names among `weights` that the optimizer trains
    optimizer: Arrays  # the optimizer's state, in the framework's own layout


class Adapter(ABC):
    """One framework under Horovod: device, wrapped optimizer, collectives, weights.

    What a framework must write is the abstract methods: `init`, `setup`, `step`,
    `broadcast_state`, `sync_buffers`, `eval_batch`, `state` and `load_state`. `export` and
    bench's `local_step` and `gradient_allreduce` are optional; the rest is written here once.
    """

    name: ClassVar[str]
    hvd: ModuleType  # the binding: horovod.torch or horovod.tensorflow
    # Why an adapter that is not `Elastic` is not, and what to do instead.
    without_elastic: ClassVar[str] = ""
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    local_size: int = 1

    @abstractmethod
    def init(self, may_overlap: bool = True) -> None:
        """Initialises Horovod and pins this process to its GPU or its share of CPU threads;
        `may_overlap`: whether the step may send gradients while the backward pass goes on."""

    @abstractmethod
    def setup(
        self, model: Any, optimizer: Optimizer, loss: Loss, horovod: Horovod, precision: str
    ) -> None:
        """Takes the model to train (a torch module, or a Keras model on this framework's
        backend) onto the device, with the optimizer, the loss, how gradients travel, and the
        passes' precision ("fp32", "bf16-mixed", "fp16-mixed": the weights stay fp32, and
        fp16's loss is scaled so that small gradients do not vanish). With the recipe's own
        optimizer (`optimizer.function`), checks what it made: one UsageError line."""

    @abstractmethod
    def broadcast_state(self, include_optimizer: bool) -> None:
        """Makes every rank hold rank 0's weights (and optimizer state, if asked)."""

    @abstractmethod
    def sync_buffers(self) -> None:
        """Gives every rank rank 0's non-trained state (batchnorm's running statistics), as
        torch's DDP does before each forward pass; called before evaluating."""

    # The framework's implementation of each loss the recipe may name (`LOSSES`).
    losses: ClassVar[Mapping[str, Callable[[Any, Any], Any]]]

    def resolved_loss(self, loss: Loss) -> Callable[[Any, Any], Any]:
        """The recipe's loss as a function of the framework's tensors: its own function, or
        this framework's implementation of the loss it names."""
        return self.losses[loss] if isinstance(loss, str) else loss

    @staticmethod
    def decayed(optimizer: Optimizer, names: list[str], layer_types: list[str]) -> list[bool]:
        """Whether weight decay applies to each trainable parameter, by its name and its
        layer's type (`weight_decay_exclude`)."""
        return [optimizer.decays(n, t) for n, t in zip(names, layer_types, strict=True)]

    overlap_choice: OverlapChoice  # made by setup, which knows the gradients' buckets
    # Set by setup: the one-process learning rate the schedule scales and warms up (the
    # recipe's, or its own optimizer's first group's).
    learning_rate: float

    def train_step(
        self, batches: list[Batch], learning_rate: float, seed: int, flags: np.ndarray
    ) -> StepResult:
        """One optimizer step: a forward and backward pass per batch (the recipe's
        backward_passes_per_step of them), the gradients averaged over batches and ranks, then
        the update. Batch k's dropout is seeded with `seed + k`. `flags` (small floats) travel
        with the gradients and come back summed over the ranks."""
        choice = self.overlap_choice
        result = self.step(batches, learning_rate, seed, choice.flags(flags), choice.overlap)
        return choice.record(result, self.world_size)

    @abstractmethod
    def step(
        self, batches: list[Batch], learning_rate: float, seed: int, flags: np.ndarray,
        overlap: bool,
    ) -> StepResult:  # fmt: skip
        """`train_step` in this framework: with `overlap`, the gradients travel in buckets
        while the last backward pass goes on, else in one group after it."""

    # Optional: what `hvd-train bench` times (a framework without them trains, but cannot be
    # benched).
    def local_step(self, batches: list[Batch], seed: int) -> None:
        """The step without the exchange, on this rank alone, for `hvd-train bench`: the
        passes, then the update with this rank's own gradients, which never reach Horovod."""
        raise UsageError(f"hvd-train bench cannot time {self.name}: its adapter has no local step")

    def gradient_allreduce(self) -> Callable[[], Any]:
        """A plain allreduce of tensors shaped like the gradients (as they travel: fp16 under
        compression), ready to run again and again."""
        raise UsageError(f"hvd-train bench cannot time {self.name}: its adapter has no exchange "
                         "to time alone")  # fmt: skip

    def time_gradient_allreduce(self, repeats: int) -> float:
        """Seconds per `gradient_allreduce`, with no training around it."""
        reduce = self.gradient_allreduce()
        reduce()  # warmed up (and traced, in TensorFlow)
        started = time.perf_counter()
        for _ in range(repeats):
            reduce()
        return (time.perf_counter() - started) / repeats

    @abstractmethod
    def eval_batch(self, x: np.ndarray, y: Any = None) -> tuple[float, np.ndarray]:
        """One local batch in inference mode: the recipe's loss summed over its examples (the
        batch's mean loss times its size; NaN without labels `y`), and the model's outputs
        (before any softmax), as fp32."""

    def logits(self, x: np.ndarray) -> np.ndarray:
        """The model's outputs on `x` (before any softmax), in inference mode."""
        return self.eval_batch(x)[1]

    # Optional: a framework whose registry entry lists export formats writes them here.
    def export(self, path: Path, format: str, example: np.ndarray) -> Exported:
        """Writes the model for serving, in `format` (one of this framework's in
        `EXPORT_FORMATS`), at `path`; it takes inputs as the data gives them. Returns where
        it went (another suffix where a fallback wrote it), and the model's outputs on `example`
        as exported and as loaded back from the file."""
        raise UsageError(f"{self.name} exports to no format")

    def allreduce_sum(self, values: np.ndarray) -> np.ndarray:
        """Element-wise sum of `values` over all ranks, in float64 and in rank order, so that
        every rank gets the same figures bit for bit."""
        gathered = self.allgather_object(np.asarray(values, dtype=np.float64))
        return np.sum(gathered, axis=0)

    def broadcast_object(self, value: Any) -> Any:
        """Rank 0's `value`, on every rank."""
        return self.hvd.broadcast_object(value, root_rank=0, name=OBJECT_COLLECTIVE)

    def allgather_object(self, value: Any) -> list[Any]:
        """Every rank's `value`, in rank order, on every rank."""
        return list(self.hvd.allgather_object(value, name=OBJECT_COLLECTIVE))

    @abstractmethod
    def state(self) -> ModelState:
        """What this rank holds, as NumPy arrays (copies) in the framework's own layout."""

    @abstractmethod
    def load_state(self, weights: Arrays | None = None, optimizer: Arrays | None = None) -> None:
        """Loads what `state` returned: all the weights, the optimizer's state, or both; every
        tensor of what is given must be there. A `ValueError` names what does not fit."""

    def weights(self) -> Arrays:
        """The model's weights and running statistics, as the framework names them."""
        return self.state().weights

    def trained_state(self) -> Arrays:
        """What every replica must hold identically: the trained weights and the optimizer's
        state (not batchnorm's statistics, which follow each rank's own batches)."""
        state = self.state()
        trained = {f"weight.{name}": state.weights[name] for name in state.trained}
        return trained | {f"optimizer.{name}": array for name, array in state.optimizer.items()}

    @property
    def is_rank_zero(self) -> bool:
        return self.rank == 0

    def on_rank_zero(self, action: Callable[[], T]) -> T:
        """Runs `action` on rank 0 and hands its result, or its UsageError, to every rank, so a
        mistake found on rank 0 stops all ranks at once instead of leaving them in a collective."""
        outcome: tuple[T | None, str | None] = (None, None)
        if self.is_rank_zero:
            try:
                outcome = (action(), None)
            except UsageError as error:
                outcome = (None, str(error))
        result, message = self.broadcast_object(outcome)
        if message is not None:
            raise UsageError(message, every_rank=True)
        return result

    @staticmethod
    def apply_horovod_defaults() -> None:
        """HOROVOD_DEFAULTS into the environment, where it has no value; before hvd.init, which
        reads them."""
        for name, value in HOROVOD_DEFAULTS.items():
            os.environ.setdefault(name, value)

    def threads_per_rank(self) -> int:
        """This process's share of the CPU cores, so ranks on one host do not oversubscribe it;
        $HVD_TRAIN_THREADS overrides it."""
        given = os.environ.get("HVD_TRAIN_THREADS", "")
        if given:
            if not given.isdigit() or int(given) < 1:
                raise UsageError(f"HVD_TRAIN_THREADS={given!r}: expected a positive integer")
            return int(given)
        return max(1, available_cores() // self.local_size)


def keep_freed_memory() -> None:
    """Have glibc's malloc keep the memory a step frees for the next step rather than give it
    back to the system and fault it in again. By default it hands back the free top of its heap
    above a threshold that follows the allocations' sizes; with a data source that allocates
    beside the passes it handed back and faulted in each step's activations, which slowed the
    passes (docs/history.md, "Decoding beside the step"). Left alone where the
    environment sets malloc's parameters itself, or without glibc."""
    tunables = os.environ.get("GLIBC_TUNABLES", "")
    if "glibc.malloc." in tunables or any(name.startswith("MALLOC_") for name in os.environ):
        return
    mallopt = getattr(ctypes.CDLL(None), "mallopt", None)
    if mallopt is None:
        return
    mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)
    mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES)


def available_cores(cgroup: Path = Path("/sys/fs/cgroup")) -> int:
    """The cores this process may use: its CPU affinity, capped by a cgroup CPU quota (a
    container's --cpus, a Kubernetes CPU limit), which the affinity does not show."""
    cores = len(os.sched_getaffinity(0))
    quota = cgroup_cpu_quota(cgroup)
    return max(1, min(cores, math.floor(quota))) if quota else cores


def cgroup_cpu_quota(cgroup: Path) -> float | None:
    """The CPU quota in cores, from cgroup v2's cpu.max or v1's CFS files; None if unlimited."""
    try:
        limit, period = (cgroup / "cpu.max").read_text().split()
        return None if limit == "max" else int(limit) / int(period)
    except (OSError, ValueError):
        pass
    try:
        cfs_quota = int((cgroup / "cpu" / "cpu.cfs_quota_us").read_text())
        cfs_period = int((cgroup / "cpu" / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    return cfs_quota / cfs_period if cfs_quota > 0 else None
