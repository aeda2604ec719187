"""What a framework brings to the distributed layer: its `Backend`, the strategy that the
façade's facets drive, in the shape of Lightning Fabric's strategies. A backend starts Horovod
for its framework, takes a model and an optimizer (`setup`), runs a step, evaluates a batch, and
moves the model's state between ranks and to and from NumPy; everything around it (collectives
of objects, checkpoints, data, the replica check) is the facets', written once."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, ClassVar, Protocol, TypeVar, runtime_checkable

import numpy as np

from hvd_train.distributed.checkpoint_files import Arrays
from hvd_train.errors import UsageError
from hvd_train.recipe.settings import ExchangeSettings

T = TypeVar("T")
Batch = tuple[Any, Any]  # inputs and labels (an array, or a tuple of them), as NumPy
# Where an export went, the exported model's outputs on the examples, and the same from the
# written file loaded back (None where the runtime that loads it is not installed).
Exported = tuple[Path, np.ndarray, np.ndarray | None]
Loss = str | Callable[[Any, Any], Any]  # "cross_entropy", or (outputs, labels) -> mean loss


@dataclass(frozen=True)
class StepResult:
    """What one step tells every rank, all from the allreduce that averages the gradients
    (no collective of its own)."""

    loss: float  # the step's loss, averaged over its batches and over the ranks
    gradients_finite: bool  # whether every averaged gradient is finite (a skipped fp16 step's is)
    # The norm of the averaged gradients, before any clipping, where the step took it: where it
    # clips them, or they are sharded, or not finite (None elsewhere: torch checks their sum).
    gradient_norm: float | None
    carried: np.ndarray  # the values each rank gave the step, averaged over the ranks
    compute_seconds: float  # this rank's forward and backward passes (T_comp)
    sync_seconds: float  # its wait for the exchange after them, what they did not hide (T_sync)
    # The last pass's time from its first full bucket of gradients to its end: how long a
    # transfer could hide behind it (T_hide; 0 where the gradients make one bucket).
    hide_seconds: float


@dataclass(frozen=True)
class ModelState:
    """A rank's model and optimizer, as the framework names and shapes them (a model's `Layout`
    converts the weights for checkpoints)."""

    weights: Arrays  # every weight and running statistic (batchnorm's)
    trained: tuple[str, ...]  # the names among `weights` that the optimizer trains
    optimizer: Arrays  # the optimizer's state, in the framework's own layout


class ElasticState(Protocol):
    """What a loop keeps in Horovod's elastic state: where it stands, and commit() to save it
    (and learn of added or removed workers)."""

    epoch: int
    samples: int  # training samples consumed in `epoch`, across all ranks
    started: bool  # whether the job has begun (a joining worker finds it has)

    def commit(self) -> None: ...

    def save(self) -> None: ...

    def sync(self) -> None: ...


@runtime_checkable
class Elastic(Protocol):
    """A backend that can run under Horovod's elastic driver."""

    def run_elastic(self, loop: Callable[[ElasticState], T]) -> T:
        """Runs `loop` under Horovod's elastic driver: when workers leave or join, the state is
        restored to its last commit, Horovod re-initialises, and `loop` is called again."""


class Backend(ABC):
    """One framework under Horovod. What a framework must write is the abstract methods:
    `start`, `setup`, `step`, `eval_batch`, `broadcast_state`, `sync_buffers`, `state` and
    `load_state`, and for a loop of one's own `tensors`, `reseed`, `layout`, `overlapping`
    and `scale_learning_rate`. `backward`, `no_sync` and `export` are optional."""

    name: ClassVar[str]
    hvd: ModuleType  # the binding: horovod.torch or horovod.tensorflow
    # The framework's implementation of each loss a recipe may name (`LOSSES`).
    losses: ClassVar[Mapping[str, Callable[[Any, Any], Any]]]
    # Why a backend that is not `Elastic` is not, and what to do instead.
    without_elastic: ClassVar[str] = ""
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    local_size: int = 1
    device: Any = None  # where the model computes, in the framework's terms
    # Set by setup: whether each rank holds only its part of the optimizer's state (`shard`);
    # then `state` is a collective, and the whole optimizer state reaches rank 0 alone.
    sharded: bool = False
    # Set by setup: the one-process learning rate a schedule scales and warms up (the
    # optimizer's, its first group's).
    learning_rate: float

    @abstractmethod
    def start(self, precision: str | None, may_overlap: bool) -> None:
        """Initialises Horovod (or joins the job a launcher started) and pins this process to
        its GPU or its share of the CPU cores; `precision` ("bf16-mixed", "fp16-mixed"; None
        leaves it as it is) is Keras's policy for the models built after;
        `may_overlap`: whether steps may send gradients while the backward pass goes on."""

    @abstractmethod
    def setup(self, model: Any, optimizer: Any, settings: ExchangeSettings, clip_norm: float,
              loss: Loss, precision: str = "fp32") -> tuple[Any, Any]:  # fmt: skip
        """Takes the model (a torch module, or a Keras model on this framework's backend) onto
        the device, and the optimizer: the framework's own, or a recipe's `Optimizer` table it
        makes one from. Returns both, the optimizer made distributed: its step averages the
        gradients over the ranks as the `[horovod]` table's `settings` say, and clips their
        norm to `clip_norm` (0: not clipped). `loss` is what `step` and `eval_batch`
        compute; `precision` what the passes compute in (the weights stay fp32, and fp16's
        loss is scaled so that small gradients do not vanish). A mistake (an optimizer of
        another framework, ...) is one UsageError line."""

    @abstractmethod
    def step(
        self, batches: list[Batch], learning_rate: float, seed: int, carry: np.ndarray
    ) -> StepResult:
        """One optimizer step: a forward and backward pass per batch, the gradients averaged
        over batches and ranks, then the update at `learning_rate`. Batch k's dropout is seeded
        with `seed + k`. `carry` (small floats) travels with the gradients and comes back
        averaged over the ranks."""

    @abstractmethod
    def eval_batch(self, x: Any, y: Any = None) -> tuple[float, np.ndarray]:
        """One local batch in inference mode: the loss summed over its examples (the batch's
        mean loss times its size; NaN without labels `y`), and the model's outputs (before any
        softmax), as fp32."""

    @abstractmethod
    def broadcast_state(self, include_optimizer: bool) -> None:
        """Makes every rank hold rank 0's weights (and optimizer state, if asked)."""

    @abstractmethod
    def sync_buffers(self) -> None:
        """Gives every rank rank 0's non-trained state (batchnorm's running statistics), as
        torch's DDP does before each forward pass; called before evaluating."""

    @abstractmethod
    def state(self, optimizer: bool = True, weights: bool = True) -> ModelState:
        """What this rank holds, as NumPy arrays (copies) in the framework's own layout: the
        weights and the optimizer's state, each where asked. Where it is `sharded`, every rank
        asks for the optimizer's state alike, and rank 0 gets the whole of it (the others
        none)."""

    @abstractmethod
    def load_state(self, weights: Arrays | None = None, optimizer: Arrays | None = None) -> None:
        """Loads what `state` returned: all the weights, the optimizer's state, or both; every
        tensor of what is given must be there. A `ValueError` names what does not fit."""

    @abstractmethod
    def tensors(self, x: Any, y: Any) -> tuple[Any, Any]:
        """A batch from NumPy as the model takes it: the framework's tensors, on the device
        (images channels-first for a torch module, as torch lays them out)."""

    @abstractmethod
    def reseed(self, seed: int) -> None:
        """Seeds the random numbers the model's training passes draw (dropout's)."""

    @property
    @abstractmethod
    def layout(self) -> str:
        """How a checkpoint holds the set-up model's own weights: "torch" or "keras"."""

    @property
    @abstractmethod
    def overlapping(self) -> bool:
        """Whether the steps' gradients travel while the backward pass goes on."""

    @abstractmethod
    def scale_learning_rate(self, factor: float) -> None:
        """Multiplies the optimizer's learning rates (each group's) by `factor`."""

    def input_names(self) -> tuple[str, ...] | None:
        """The names the model takes its inputs by, or None where it takes any."""
        return None

    def take_place(self) -> None:
        """This process's rank, local rank, world size and local size, as Horovod says them
        (after it started, and anew after an elastic reset)."""
        self.rank, self.local_rank = self.hvd.rank(), self.hvd.local_rank()
        self.world_size, self.local_size = self.hvd.size(), self.hvd.local_size()

    def is_tensor(self, value: Any) -> bool:
        """Whether `value` is one of the framework's tensors."""
        return False

    def backward(self, loss: Any) -> None:
        """The backward pass of `loss`, scaled where the precision asks (fp16-mixed)."""
        raise UsageError(f"{self.name} takes its gradients in the loop's own way, not backward()")

    @contextmanager
    def no_sync(self) -> Iterator[None]:
        """Passes and steps whose gradients stay on this rank, as DDP's `no_sync`: backward
        passes add their gradients up locally, and a step taken inside updates with this rank's
        own (the replicas part: what a step costs without the exchange)."""
        raise UsageError(
            f"{self.name}'s loop has no no_sync(); accumulate with setup(..., "
            "backward_passes_per_step=N)"
        )
        yield

    def resolved_loss(self, loss: Loss) -> Callable[[Any, Any], Any]:
        """A recipe's loss as a function of the framework's tensors: its own function, or this
        framework's implementation of the loss it names."""
        return self.losses[loss] if isinstance(loss, str) else loss

    # Optional: a framework whose registry entry lists export formats writes them here.
    def export(self, path: Path, format: str, example: np.ndarray) -> Exported:
        """Writes the model for serving, in `format` (one of this framework's in
        `EXPORT_FORMATS`), at `path`; it takes inputs as the data gives them. Returns where
        it went (another suffix where a fallback wrote it), and the model's outputs on `example`
        as exported and as loaded back from the file."""
        raise UsageError(f"{self.name} exports to no format")
