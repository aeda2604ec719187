"""`Distributed`: Horovod's five steps for a training loop of one's own, the same under torch and
TensorFlow, and the layer hvd_train's own trainer is written on.

    dist = Distributed("torch")                     # Horovod started, this rank pinned
    model, optimizer = dist.setup(model, optimizer)  # rank 0's state everywhere; steps average
    train = dist.loader((x, y), batch_size=64)       # this rank's shard, read ahead
    for epoch in range(epochs):
        train.set_epoch(epoch)
        for inputs, labels in train:
            optimizer.zero_grad()
            dist.backward(loss_function(model(inputs), labels))
            optimizer.step()
        dist.save("runs/mine", {"model": model, "optimizer": optimizer, "epoch": epoch + 1})

It imports no framework until it is made: the framework's backend (`distributed/torch/`,
`distributed/tensorflow/`) does the framework's part; the collectives of objects, the data,
the checkpoints and the replica check are written here once.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np

from hvd_train.checkpoint import (
    Arrays,
    check_weights_fit,
    checkpoint_name,
    load_checkpoint,
    load_newest_valid,
    save_checkpoint,
)
from hvd_train.data.pipeline import DEFAULT_TIMEOUT
from hvd_train.data.transforms import Transforms
from hvd_train.distributed.backend import (
    Backend,
    Batch,
    Elastic,
    ElasticState,
    ExchangeSettings,
    Exported,
    Loss,
    ModelState,
    StepResult,
    T,
)
from hvd_train.distributed.frameworks import FRAMEWORKS, create_backend, framework_named
from hvd_train.distributed.host import host_name, threads_per_rank
from hvd_train.distributed.loader import Loader
from hvd_train.distributed.overlap import buckets
from hvd_train.errors import ReplicasDiverged, UsageError, report
from hvd_train.recipe.rules import Rule
from hvd_train.recipe.settings import LR_SCALING, PRECISIONS, Horovod
from hvd_train.version import __version__

# The name of every object broadcast and allgather. Horovod matches collectives across ranks by
# name, and its object collectives default to the object's type name: ranks that pass None and a
# string (a failure on one rank only) would wait for each other for ever.
OBJECT_COLLECTIVE = "hvd_train.object"
OPS = ("mean", "sum", "min", "max")  # what all_reduce computes
RESERVED = ("model", "optimizer")  # the keys of a saved state that are not the loop's own


def framework_in_use() -> str:
    """The framework whose module the loop imported, where it imported one only."""
    imported = [name for name, f in FRAMEWORKS.items() if f.module in sys.modules]
    if len(imported) != 1:
        found = " and ".join(imported) or "neither"
        raise UsageError(
            f"Distributed: the loop imported {found} of {', '.join(FRAMEWORKS)}; name the "
            f"framework: {' or '.join(f'Distributed({name!r})' for name in FRAMEWORKS)}"
        )
    return imported[0]


class Distributed:
    """Horovod started for `framework` ("torch" or "tensorflow"; where None, the one the loop
    imported), or joined where a launcher started the job (horovodrun, Slurm, Ray,
    `hvd_train.launch`), and this process pinned to its GPU (by local rank) or its share of
    the CPU cores. `precision` is what the passes compute in: "fp32", "bf16-mixed" or
    "fp16-mixed" (the weights stay fp32); under TensorFlow, Keras models built from now on
    take its policy. `may_overlap`: whether steps may send gradients while the backward pass
    goes on (TensorFlow then runs one op more at a time than it has cores).

    A `UsageError` that ends the loop is one line, `hvd-train: error: ...`, said once for the
    job, and exit code 2."""

    def __init__(self, framework: str | None = None, *, precision: str = "fp32",
                 may_overlap: bool = True) -> None:  # fmt: skip
        self.precision = Rule(kind=str, choices=PRECISIONS).check("precision", precision)
        name = framework_named(framework or framework_in_use()).name
        self.backend: Backend = create_backend(name)
        self.backend.start(None if precision == "fp32" else precision, may_overlap)
        self.model: Any = None
        self.optimizer: Any = None
        self.global_batch = 0  # of the last training loader: a saved step's examples
        _say_usage_errors_in_one_line()

    # Where this process stands in the job.
    @property
    def framework(self) -> str:
        return self.backend.name

    @property
    def rank(self) -> int:
        return self.backend.rank

    @property
    def local_rank(self) -> int:
        return self.backend.local_rank

    @property
    def world_size(self) -> int:
        return self.backend.world_size

    @property
    def local_size(self) -> int:
        return self.backend.local_size

    @property
    def is_rank_zero(self) -> bool:
        return self.rank == 0

    @property
    def device(self) -> Any:
        """Where the model computes: a torch.device, or TensorFlow's device name."""
        return self.backend.device

    @property
    def host(self) -> str:
        """This rank's host, as horovodrun named it (-H, --hostfile), else the machine's name."""
        return host_name()

    @property
    def threads(self) -> int:
        """This rank's share of the host's CPU cores."""
        return threads_per_rank(self.local_size)

    # The model and the optimizer.
    def setup(
        self, model: Any, optimizer: Any, *, compression: str = "none",
        overlap: bool | str = "auto", backward_passes_per_step: int = 1,
        gradient_clip_norm: float = 0.0, scale_learning_rate: str = "none",
        precision: str | None = None, loss: Loss = "cross_entropy", shard: str = "none",
    ) -> tuple[Any, Any]:  # fmt: skip
        """Takes the model onto this rank's device and makes the optimizer distributed, and
        gives every rank rank 0's weights and optimizer state (under horovodrun's elastic
        mode, the elastic state's sync does that instead). Returns the model and the
        optimizer, the same objects: the optimizer's step now averages the gradients over the
        ranks (under TensorFlow, its `apply_gradients`, which `model.fit` calls too).

        `optimizer`: the framework's own (over the model's trainable parameters, each once),
        or an `hvd_train.Optimizer(...)` table, made as a recipe's. The rest are a recipe's
        settings of the same names: `compression` ("none", "fp16", "bf16": how gradients
        travel), `overlap` (True, False, "auto": in buckets while the last backward pass goes
        on), `backward_passes_per_step` (the passes whose gradients add up locally before a
        step averages them), `gradient_clip_norm` (the averaged gradients' norm is clipped to
        it; 0: not clipped), `scale_learning_rate` ("linear", "sqrt": the rates times the
        world size, or its root; "none"), `shard` ("optimizer": each rank keeps the optimizer
        state of its part of the parameters only, and updates that part; "gradients": and of
        the averaged gradients, which it alone receives; "none"; docs/sharding.md).
        `precision`: the one given when this was made, unless given here. `loss`: what
        `train_step` and `eval_batch` compute ("cross_entropy" on logits, or a function
        `(outputs, labels) -> mean loss`)."""
        if self.model is not None:
            raise UsageError(
                "setup: called a second time; set up one model and its optimizer once per "
                "Distributed (and train on with what the first call returned)",
                every_rank=True,
            )
        horovod = Horovod(compression=compression, overlap=overlap, shard=shard,
                          backward_passes_per_step=backward_passes_per_step)  # fmt: skip
        clip = Rule(kind=float, minimum=0.0).check("gradient_clip_norm", gradient_clip_norm)
        scaling = Rule(kind=str, choices=LR_SCALING).check(
            "scale_learning_rate", scale_learning_rate
        )
        if precision is not None:
            self.precision = Rule(kind=str, choices=PRECISIONS).check("precision", precision)
        exchange = ExchangeSettings(horovod.compression, horovod.backward_passes_per_step,
                                    horovod.overlap, clip, horovod.shard)  # fmt: skip
        elastic = os.environ.get("HOROVOD_ELASTIC") == "1"  # there, the elastic state syncs
        try:
            self.model, self.optimizer = self.backend.setup(model, optimizer, exchange, loss,
                                                            self.precision)  # fmt: skip
        except UsageError as error:
            if elastic:
                raise
            self.check_same_model(str(error))
        if horovod.shard != "none" and self.world_size == 1:
            self.print(f'hvd-train: shard = "{horovod.shard}" with one rank: nothing to share '
                       "out, so it trains unsharded")  # fmt: skip
        if scaling != "none":
            self.backend.scale_learning_rate(self.world_size ** (1 if scaling == "linear" else 0.5))
        if not elastic:
            self.check_same_model(None)
            self.backend.broadcast_state(include_optimizer=True)
        return self.model, self.optimizer

    @property
    def learning_rate(self) -> float:
        """The optimizer's one-process learning rate (its first group's), which a schedule
        scales and warms up."""
        self._needs_setup("learning_rate")
        return self.backend.learning_rate

    def _needs_setup(self, what: str) -> None:
        if self.model is None:
            raise UsageError(f"{what} needs the model: call dist.setup(model, optimizer) first",
                             every_rank=True)  # fmt: skip

    def check_same_model(self, problem: str | None) -> None:
        """Every rank's setup went well (`problem`: this rank's mistake, if any) and its model
        holds the tensors of rank 0's, shape for shape: a mistake on any rank, or a model built
        differently on one, is one line on every rank here, not a hang or a failed broadcast."""
        shapes = {}
        if problem is None:
            weights = self.backend.state(optimizer=False).weights
            shapes = {name: tuple(a.shape) for name, a in weights.items()}
        everyone = self.all_gather((problem, shapes))
        for rank, (their_problem, theirs) in enumerate(everyone):
            if their_problem is not None:
                on_rank = f"rank {rank}: " if self.world_size > 1 and rank else ""
                raise UsageError(f"{on_rank}{their_problem}", every_rank=True)
            if theirs != everyone[0][1]:
                name = sorted(set(theirs.items()) ^ set(everyone[0][1].items()))[0][0]
                raise UsageError(
                    f"setup: rank {rank}'s model differs from rank 0's ({name}: "
                    f"{theirs.get(name, 'absent')} there, {everyone[0][1].get(name, 'absent')} "
                    "on rank 0); build the same model on every rank",
                    every_rank=True,
                )

    def backward(self, loss: Any) -> None:
        """The backward pass of `loss` (torch): `loss.backward()`, with the loss scaled first
        under fp16-mixed, where it must be called instead."""
        self._needs_setup("backward")
        self.backend.backward(loss)

    @contextmanager
    def no_sync(self) -> Iterator[None]:
        """Backward passes whose gradients stay on this rank, adding up in .grad, until a pass
        outside (torch): local accumulation, without the exchange's traffic."""
        self._needs_setup("no_sync")
        with self.backend.no_sync():
            yield

    # The data.
    def loader(self, dataset: Any, batch_size: int, *, shuffle: bool = True, seed: int = 0,
               workers: int | str = "auto", prefetch: int = 2,
               transforms: Sequence[dict[str, Any]] | Transforms = (),
               timeout: float = DEFAULT_TIMEOUT) -> Loader:  # fmt: skip
        """This rank's batches of `dataset` (`(inputs, labels)` arrays, a Hugging Face dataset,
        a split of `hvd_train.Data(...).load()`, or any object with `len()` whose `[indices]`
        gives `(inputs, labels)`), read ahead by `workers` threads up to `prefetch` batches
        (as a recipe's `[data]` keys say), as the framework's tensors. With `shuffle`, a
        training loader: a disjoint shard per rank in a new order each epoch (`set_epoch`),
        all ranks the same number of batches, `transforms` (a recipe's `[data] transforms`
        tables) applied, each example's random numbers from the seed; without, each rank a
        slice of the examples, every one once, with the deterministic transforms only."""
        made = Loader(self.backend, dataset, batch_size, shuffle=shuffle, seed=seed,
                      workers=workers, prefetch=prefetch, transforms=transforms,
                      timeout=timeout, threads=self.threads)  # fmt: skip
        if shuffle:
            self.global_batch = made.global_batch
        return made

    # Collectives: every rank calls each, in the same order.
    def all_reduce(self, value: Any, op: str = "mean") -> Any:
        """`value` reduced over the ranks by `op` ("mean", "sum", "min", "max"): a tensor of the
        framework (by Horovod, on the device), or a number or array (in float64, in rank
        order: bit for bit the same on every rank)."""
        Rule(kind=str, choices=OPS).check("all_reduce: op", op)
        if self.backend.is_tensor(value):
            hvd = self.backend.hvd
            ops = {"mean": hvd.Average, "sum": hvd.Sum, "min": hvd.Min, "max": hvd.Max}
            return hvd.allreduce(value, op=ops[op])
        gathered = np.stack(self.all_gather(np.asarray(value, dtype=np.float64)))
        if op in ("min", "max"):
            reduced = gathered.min(axis=0) if op == "min" else gathered.max(axis=0)
        else:
            reduced = gathered.sum(axis=0) / (len(gathered) if op == "mean" else 1)
        return float(reduced) if np.ndim(value) == 0 else reduced

    def all_gather(self, value: Any) -> Any:
        """Every rank's `value`: tensors of the framework joined along their first axis (by
        Horovod), anything else (picklable) as a list in rank order."""
        if self.backend.is_tensor(value):
            return self.backend.hvd.allgather(value)
        return list(self.backend.hvd.allgather_object(value, name=OBJECT_COLLECTIVE))

    def broadcast(self, value: Any, root: int = 0) -> Any:
        """Rank `root`'s `value` on every rank: a tensor of the framework, or any picklable
        object."""
        hvd = self.backend.hvd
        if self.backend.is_tensor(value):
            return hvd.broadcast(value, root_rank=root)
        return hvd.broadcast_object(value, root_rank=root, name=OBJECT_COLLECTIVE)

    def barrier(self) -> None:
        """Waits until every rank is here."""
        self.all_gather(None)

    def on_rank_zero(self, action: Callable[[], T]) -> T:
        """Runs `action` on rank 0 and hands its result, or its UsageError, to every rank, so a
        mistake found on rank 0 stops all ranks at once instead of leaving them in a collective."""
        outcome: tuple[T | None, str | None] = (None, None)
        if self.is_rank_zero:
            try:
                outcome = (action(), None)
            except UsageError as error:
                outcome = (None, str(error))
        result, message = self.broadcast(outcome)
        if message is not None:
            raise UsageError(message, every_rank=True)
        return result

    # Rank 0 speaks.
    def print(self, *values: Any, **options: Any) -> None:
        """`print`, on rank 0 only."""
        if self.is_rank_zero:
            print(*values, **options, flush=True)

    def logger(self, name: str | None = None) -> logging.Logger:
        """The logger `name`, whose records rank 0 alone emits."""
        logger = logging.getLogger(name)
        if not any(isinstance(f, _OnRankZero) for f in logger.filters):
            logger.addFilter(_OnRankZero(self.rank))
        return logger

    # Checkpoints: hvd_train's format, which `hvd-train eval` and `export` read.
    def save(self, directory: str | Path, state: dict[str, Any], *, recipe: str | None = None,
             keep: int = 3) -> Path:  # fmt: skip
        """Saves `state` into `directory`'s checkpoints/ (every rank calls it; rank 0 writes,
        atomically, with checksums, keeping the newest `keep`): its "model" and "optimizer"
        (the ones `setup` returned), and the loop's own values beside them (numbers, strings,
        lists, dicts), which every rank must hold alike. "epoch" and "step" (the steps done in
        it) name the checkpoint. `recipe`: a Python recipe file that names the model and its
        data, for `hvd-train eval` and `export` to rebuild the model. Its path, on every rank."""
        self._needs_setup("save")
        if state.get("model") is not self.model or state.get("optimizer") is not self.optimizer:
            raise UsageError(
                'save: state["model"] and state["optimizer"] must be the ones setup returned'
            )
        values = {key: value for key, value in state.items() if key not in RESERVED}
        text = _loop_values(values)
        epoch, step = int(values.get("epoch", 0)), int(values.get("step", 0))
        for rank, theirs in enumerate(self.all_gather(text)):
            if theirs != text:
                raise UsageError(
                    f"save: rank {rank} saves other values than rank 0 ({theirs} against "
                    f"{text}); save what every rank holds alike",
                    every_rank=True,
                )
        folder = Path(directory) / "checkpoints"
        saved = {
            "epoch": epoch, "step_in_epoch": step, "samples_in_epoch": step * self.global_batch,
            "world_size": self.world_size, "global_batch_size": self.global_batch,
            "recipe": Path(recipe).stem if recipe else "own loop",
            "recipe_source": str(Path(recipe).resolve()) if recipe else "",
            "layout": self.backend.layout, "framework": self.framework,
            "hvd_train_version": __version__, "loop": values,
        }  # fmt: skip

        held = self.saved_state()

        def write() -> Path:
            assert held is not None  # on rank 0
            name = checkpoint_name(epoch, step * self.global_batch)
            return save_checkpoint(folder, name, held.weights, held.optimizer, saved, "", keep)

        return self.on_rank_zero(write)

    def load(self, path: str | Path) -> dict[str, Any] | None:
        """Loads the checkpoint at `path` (one, or the newest sound one of a run's folder) into
        the model and the optimizer `setup` returned, on every rank; returns the loop's values
        saved with it (None where the folder holds no checkpoint). A checkpoint of another
        model, or of the other framework, is one line."""
        self._needs_setup("load")
        where = Path(path)

        def read() -> dict[str, Any] | None:
            if (where / "state.json").is_file():
                checkpoint = load_checkpoint(where)
            else:
                found = load_newest_valid(where / "checkpoints")
                if found is None:
                    return None
                checkpoint = found
            kept = checkpoint.state
            if kept["framework"] != self.framework or kept["layout"] != self.backend.layout:
                raise UsageError(
                    f"checkpoint {checkpoint.path} holds a {kept['framework']} model's state "
                    f"({kept['layout']} weights), and this loop trains a {self.framework} model; "
                    "load it into the model that wrote it"
                )
            check_weights_fit(checkpoint, self.backend.state(optimizer=False).weights,
                              "load it into the model that wrote it")  # fmt: skip
            try:
                self.backend.load_state(checkpoint.weights, checkpoint.optimizer)
            except (ValueError, KeyError, RuntimeError) as error:
                raise UsageError(
                    f"checkpoint {checkpoint.path}'s optimizer state does not fit this optimizer "
                    f"({error}); load it with the optimizer that wrote it"
                ) from None
            loop: dict[str, Any] = kept.get("loop", {})
            return loop

        values = self.on_rank_zero(read)
        if values is not None:
            self.backend.broadcast_state(include_optimizer=True)
        return values

    def trained_state(self) -> Arrays:
        """What every replica must hold identically: the trained weights (`weight.<name>`) and
        the optimizer's state (`optimizer.<name>`; not where each rank holds its own part of
        it, `shard`), not batchnorm's statistics, which follow each rank's own batches."""
        self._needs_setup("trained_state")
        state = self.backend.state(optimizer=not self.backend.sharded)
        trained = {f"weight.{name}": state.weights[name] for name in state.trained}
        return trained | {f"optimizer.{name}": array for name, array in state.optimizer.items()}

    def check_replicas(self, where: str = "") -> None:
        """Every rank must hold the same trained weights and optimizer state, bit for bit; a
        difference means the replicas diverged (a bug in the loop, hvd_train, Horovod or the
        model), which would otherwise train on silently: `ReplicasDiverged`, naming the first
        tensor and rank that differ. Each rank hashes each tensor; the hashes are gathered."""
        trained = self.trained_state()
        digests = [hashlib.blake2b(np.ascontiguousarray(array).tobytes(), digest_size=8).digest()
                   for array in trained.values()]  # fmt: skip
        everyone = self.all_gather((list(trained), digests))
        names, ours = everyone[0]  # rank 0's
        differing = [
            (name, rank)
            for index, name in enumerate(names)
            for rank, (their_names, theirs) in enumerate(everyone)
            if their_names != names or theirs[index] != ours[index]
        ]
        if differing:
            name, rank = differing[0]
            count = len({tensor for tensor, _ in differing})
            raise ReplicasDiverged(
                f"{where or 'now'}, rank {rank} holds another {name} than rank 0 ({count} of "
                f"{len(names)} tensors differ): the replicas diverged, which is a bug, and "
                "training stopped before saving this point; please report it with the run's "
                "command"
            )

    # What hvd_train's trainer drives besides; a loop of its own may too.
    def train_step(self, batches: list[Batch], learning_rate: float, seed: int,
                   carry: Sequence[float] | np.ndarray = ()) -> StepResult:  # fmt: skip
        """One whole step on NumPy batches (one per backward pass: `backward_passes_per_step`
        of them): batch k's dropout seeded with `seed + k`, the forward and backward passes
        with setup's `loss`, the gradients averaged over the batches and the ranks, the update
        at `learning_rate`. `carry` (small numbers: a loop's stop flags) travels with the
        gradients and comes back averaged over the ranks, with no collective of its own."""
        self._needs_setup("train_step")
        return self.backend.step(batches, learning_rate, seed, np.asarray(carry, np.float64))

    def eval_batch(self, x: Any, y: Any = None) -> tuple[float, np.ndarray]:
        """One local batch (NumPy) in inference mode: setup's loss summed over its examples
        (NaN without labels `y`), and the model's outputs as fp32 NumPy."""
        self._needs_setup("eval_batch")
        return self.backend.eval_batch(x, y)

    def input_names(self) -> tuple[str, ...] | None:
        """The names the model takes named inputs by (a torch module's `forward` parameters, a
        Keras model's inputs), or None where it takes any."""
        self._needs_setup("input_names")
        return self.backend.input_names()

    def sync_buffers(self) -> None:
        """Gives every rank rank 0's running statistics (batchnorm's), before evaluating."""
        self.backend.sync_buffers()

    def broadcast_state(self) -> None:
        """Gives every rank rank 0's weights and optimizer state (after rank 0 alone loaded
        them)."""
        self.backend.broadcast_state(include_optimizer=True)

    def state(self, optimizer: bool = True) -> ModelState:
        """This rank's weights and optimizer state (where asked), as NumPy copies in the
        framework's layout. With `shard`, every rank asks alike: the optimizer's state is
        gathered onto rank 0 (the other ranks get none)."""
        self._needs_setup("state")
        return self.backend.state(optimizer)

    def saved_state(self) -> ModelState | None:
        """What rank 0 saves (every rank calls it: with `shard`, the optimizer's state is
        gathered onto rank 0); None on the other ranks."""
        self._needs_setup("saved_state")
        if self.is_rank_zero:
            return self.backend.state()
        if self.backend.sharded:
            self.backend.state(weights=False)  # this rank's part, gathered onto rank 0
        return None

    def load_state(self, weights: Arrays | None = None, optimizer: Arrays | None = None) -> None:
        """Loads what `state` returned, on this rank; a `ValueError` names what does not fit."""
        self.backend.load_state(weights, optimizer)

    def export(self, path: Path, format: str, example: np.ndarray) -> Exported:
        """Writes the model for serving (`hvd-train export`'s formats of this framework)."""
        return self.backend.export(path, format, example)

    @property
    def without_elastic(self) -> str:
        """Why this framework cannot train under Horovod's elastic driver ("" where it can)."""
        return "" if isinstance(self.backend, Elastic) else self.backend.without_elastic

    @property
    def overlapping(self) -> bool:
        """Whether the steps' gradients travel while the backward pass goes on, as the setting
        or (for "auto") the first steps' times decided."""
        self._needs_setup("overlapping")
        return self.backend.overlapping

    def run_elastic(self, loop: Callable[[ElasticState], T]) -> T:
        """Runs `loop` under Horovod's elastic driver (torch): when workers leave or join, the
        state goes back to its last commit, Horovod starts anew, and `loop` is called again."""
        if not isinstance(self.backend, Elastic):
            raise UsageError(f"elastic training is not available under {self.framework}: "
                             f"{self.backend.without_elastic}")  # fmt: skip
        return self.backend.run_elastic(loop)

    def local_step(self, batches: list[Batch], seed: int) -> None:
        """`train_step` on this rank alone, nothing exchanged (what `hvd-train bench` times)."""
        self.backend.local_step(batches, seed)

    def time_gradient_allreduce(self, repeats: int) -> float:
        """Seconds per allreduce of tensors shaped like the gradients, as they travel, with no
        training around it."""
        reduce = self.backend.gradient_allreduce()
        reduce()  # warmed up (and traced, in TensorFlow)
        started = time.perf_counter()
        for _ in range(repeats):
            reduce()
        return (time.perf_counter() - started) / repeats


def _loop_values(values: dict[str, Any]) -> str:
    """The loop's own saved values as state.json holds them; one line where it cannot."""
    try:
        return json.dumps(values, sort_keys=True, allow_nan=False)
    except (TypeError, ValueError) as error:
        raise UsageError(
            f"save: the loop's values cannot be saved ({error}); give numbers, strings, lists "
            "and dicts beside the model and the optimizer"
        ) from None


class _OnRankZero(logging.Filter):
    def __init__(self, rank: int) -> None:
        super().__init__()
        self.rank = rank

    def filter(self, record: logging.LogRecord) -> bool:
        return self.rank == 0


def _say_usage_errors_in_one_line() -> None:
    """A UsageError that ends the loop's script is one line and exit code 2, as the CLI's."""
    if getattr(sys.excepthook, "hvd_train", False):
        return
    previous = sys.excepthook

    def hook(kind: type[BaseException], error: BaseException,
             traceback: TracebackType | None) -> None:  # fmt: skip
        if not isinstance(error, UsageError):
            previous(kind, error, traceback)
            return
        report(error)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(2)

    hook.hvd_train = True  # type: ignore[attr-defined]
    sys.excepthook = hook


__all__ = ["Distributed", "ElasticState", "Loader", "ModelState", "StepResult", "buckets"]
