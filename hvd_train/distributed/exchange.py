"""This rank's model and optimizer, set up for the exchange: the optimizer made distributed as
the `[horovod]` table says (the gradients averaged over the ranks, in buckets, 16-bit on the
wire, the state sharded), rank 0's state handed out, and what the framework's backend does with
them from then on: the steps, evaluation, the state as NumPy, the replica check, the export,
the elastic driver."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from hvd_train.distributed.backend import (
    Backend,
    Batch,
    Elastic,
    ElasticState,
    Exported,
    Loss,
    ModelState,
    StepResult,
    T,
)
from hvd_train.distributed.checkpoint_files import Arrays
from hvd_train.distributed.collectives import Collectives
from hvd_train.distributed.precision import Precision
from hvd_train.errors import ReplicasDiverged, UsageError
from hvd_train.recipe.learning_rate import scaling_factor
from hvd_train.recipe.settings import ExchangeSettings

FP32 = Precision()


class Exchange:
    """Set up once (`setup`); every other call needs it."""

    def __init__(self, backend: Backend, collectives: Collectives) -> None:
        self.backend, self.collectives = backend, collectives
        self.model: Any = None
        self.optimizer: Any = None
        self.settings = ExchangeSettings()

    def setup(self, model: Any, optimizer: Any, settings: ExchangeSettings, *,
              clip_norm: float = 0.0, scaling: str = "none", loss: Loss = "cross_entropy",
              precision: Precision = FP32) -> tuple[Any, Any]:  # fmt: skip
        """`model` onto this rank's device and `optimizer` made distributed as `settings` (the
        `[horovod]` table) say, its gradients' norm clipped to `clip_norm`, its learning rates
        scaled by `scaling`'s rule; every rank given rank 0's weights and optimizer state
        (under horovodrun's elastic mode, the elastic state's sync does that instead)."""
        if self.model is not None:
            raise UsageError(
                "setup: called a second time; set up one model and its optimizer once per "
                "Distributed (and train on with what the first call returned)",
                every_rank=True,
            )
        elastic = os.environ.get("HOROVOD_ELASTIC") == "1"  # there, the elastic state syncs
        try:
            self.model, self.optimizer = self.backend.setup(
                model, optimizer, settings, clip_norm, loss, precision.name
            )
        except UsageError as error:
            if elastic:
                raise
            self.check_same_model(str(error))
        self.settings = settings
        world = self.backend.world_size
        if settings.shard != "none" and world == 1 and self.backend.rank == 0:
            print(f'hvd-train: shard = "{settings.shard}" with one rank: nothing to share out, '
                  "so it trains unsharded", flush=True)  # fmt: skip
        if scaling != "none":
            passes = settings.backward_passes_per_step
            self.backend.scale_learning_rate(scaling_factor(world * passes, scaling))
        if not elastic:
            self.check_same_model(None)
            self.backend.broadcast_state(include_optimizer=True)
        return self.model, self.optimizer

    def needs_setup(self, what: str) -> None:
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
        everyone = self.collectives.all_gather((problem, shapes))
        for rank, (their_problem, theirs) in enumerate(everyone):
            if their_problem is not None:
                on_rank = f"rank {rank}: " if len(everyone) > 1 and rank else ""
                raise UsageError(f"{on_rank}{their_problem}", every_rank=True)
            if theirs != everyone[0][1]:
                name = sorted(set(theirs.items()) ^ set(everyone[0][1].items()))[0][0]
                raise UsageError(
                    f"setup: rank {rank}'s model differs from rank 0's ({name}: "
                    f"{theirs.get(name, 'absent')} there, {everyone[0][1].get(name, 'absent')} "
                    "on rank 0); build the same model on every rank",
                    every_rank=True,
                )

    @property
    def learning_rate(self) -> float:
        """The optimizer's one-process learning rate (its first group's), which a schedule
        scales and warms up."""
        self.needs_setup("learning_rate")
        return self.backend.learning_rate

    @property
    def sharded(self) -> bool:
        """Whether each rank holds its part of the training state only (`shard`, at np > 1)."""
        return self.backend.sharded

    @property
    def overlapping(self) -> bool:
        """Whether the steps' gradients travel while the backward pass goes on, as the setting
        or (for "auto") the first steps' times decided."""
        self.needs_setup("overlapping")
        return self.backend.overlapping

    @property
    def layout(self) -> str:
        """How the backend names and shapes the model's weights: "torch" or "keras"."""
        return self.backend.layout

    def backward(self, loss: Any) -> None:
        self.needs_setup("backward")
        self.backend.backward(loss)

    @contextmanager
    def no_sync(self) -> Iterator[None]:
        self.needs_setup("no_sync")
        with self.backend.no_sync():
            yield

    def tensor(self, array: np.ndarray) -> Any:
        """`array`, flattened, as the framework's tensor on this rank's device (what the
        collectives reduce by Horovod)."""
        flat = np.ravel(array)
        return self.backend.tensors(flat, flat[:0])[0]

    def step(self, batches: list[Batch], learning_rate: float, seed: int,
             carry: Sequence[float] | np.ndarray = ()) -> StepResult:  # fmt: skip
        """One whole step on NumPy batches (one per backward pass: `backward_passes_per_step`
        of them): batch k's dropout seeded with `seed + k`, the forward and backward passes
        with setup's `loss`, the gradients averaged over the batches and the ranks, the update
        at `learning_rate`. `carry` (small numbers: a loop's stop flags) travels with the
        gradients and comes back averaged over the ranks, with no collective of its own. Inside
        `no_sync`, the update takes this rank's own gradients, and `carry` comes back as given."""
        self.needs_setup("step")
        return self.backend.step(batches, learning_rate, seed, np.asarray(carry, np.float64))

    def eval_batch(self, x: Any, y: Any = None) -> tuple[float, np.ndarray]:
        """One local batch (NumPy) in inference mode: setup's loss summed over its examples
        (NaN without labels `y`), and the model's outputs as fp32 NumPy."""
        self.needs_setup("eval_batch")
        return self.backend.eval_batch(x, y)

    def input_names(self) -> tuple[str, ...] | None:
        """The names the model takes named inputs by (a torch module's `forward` parameters, a
        Keras model's inputs), or None where it takes any."""
        self.needs_setup("input_names")
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
        framework's layout. Sharded, every rank asks alike: the optimizer's state is gathered
        onto rank 0 (the other ranks get none)."""
        self.needs_setup("state")
        return self.backend.state(optimizer)

    def saved_state(self) -> ModelState | None:
        """What rank 0 saves (every rank calls it: sharded, the optimizer's state is gathered
        onto rank 0); None on the other ranks."""
        self.needs_setup("saved_state")
        if self.backend.rank == 0:
            return self.backend.state()
        if self.backend.sharded:
            self.backend.state(weights=False)  # this rank's part, gathered onto rank 0
        return None

    def load_state(self, weights: Arrays | None = None, optimizer: Arrays | None = None) -> None:
        """Loads what `state` returned, on this rank; a `ValueError` names what does not fit."""
        self.backend.load_state(weights, optimizer)

    def trained_state(self) -> Arrays:
        """What every replica must hold identically: the trained weights (`weight.<name>`) and
        the optimizer's state (`optimizer.<name>`; not where each rank holds its own part of
        it, `shard`), not batchnorm's statistics, which follow each rank's own batches."""
        self.needs_setup("trained_state")
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
        everyone = self.collectives.all_gather((list(trained), digests))
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

    def export(self, path: Path, format: str, example: np.ndarray) -> Exported:
        """Writes the model for serving (`hvd-train export`'s formats of this framework)."""
        return self.backend.export(path, format, example)

    @property
    def without_elastic(self) -> str:
        """Why this framework cannot train under Horovod's elastic driver ("" where it can)."""
        return "" if isinstance(self.backend, Elastic) else self.backend.without_elastic

    def run_elastic(self, loop: Callable[[ElasticState], T]) -> T:
        """Runs `loop` under Horovod's elastic driver (torch): when workers leave or join, the
        state goes back to its last commit, Horovod starts anew, and `loop` is called again."""
        if not isinstance(self.backend, Elastic):
            raise UsageError(f"elastic training is not available under {self.backend.name}: "
                             f"{self.backend.without_elastic}")  # fmt: skip
        return self.backend.run_elastic(loop)
