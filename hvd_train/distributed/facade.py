"""`Distributed`: Horovod's five steps for a training loop of one's own, the same under torch and
TensorFlow, and the façade hvd_train's own trainer is written on.

    dist = Distributed("torch")                     # Horovod started, this rank pinned
    model, optimizer = dist.setup(model, optimizer)  # rank 0's state everywhere; steps average
    train = dist.loader((x, y), batch_size=64)       # this rank's slice, read ahead
    for epoch in range(epochs):
        train.set_epoch(epoch)
        for inputs, labels in train:
            optimizer.zero_grad()
            dist.backward(loss_function(model(inputs), labels))
            optimizer.step()
        dist.save("runs/mine", {"model": model, "optimizer": optimizer, "epoch": epoch + 1})

The façade keeps what a loop calls; each job is a facet's, as Lightning Fabric hands work to its
strategy and plugins: `environment` (the framework's backend started, where this rank stands),
`collectives`, `exchange` (the model and optimizer set up: the step, evaluation, the state),
`checkpoints` (the one checkpoint path), and the data's `Loader`. hvd_train's trainer calls the
facets too. It imports no framework until it is made.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from hvd_train.data.pipeline import DEFAULT_TIMEOUT
from hvd_train.data.transforms import Transforms
from hvd_train.distributed.backend import Loss, T
from hvd_train.distributed.checkpoints import CheckpointIO, Layout
from hvd_train.distributed.collectives import Collectives
from hvd_train.distributed.environment import Environment
from hvd_train.distributed.exchange import Exchange
from hvd_train.distributed.loader import Loader
from hvd_train.distributed.precision import Precision
from hvd_train.errors import UsageError
from hvd_train.recipe.rules import Rule
from hvd_train.recipe.settings import LR_SCALING, ExchangeSettings


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
        self.precision = Precision(precision)
        self.environment = Environment(framework, self.precision, may_overlap)
        self.collectives = Collectives(self.environment.backend)
        self.exchange = Exchange(self.environment.backend, self.collectives)
        self.checkpoints = CheckpointIO(self.exchange, self.collectives)

    # Where this process stands in the job.
    @property
    def framework(self) -> str:
        return self.environment.framework

    @property
    def rank(self) -> int:
        return self.environment.rank

    @property
    def local_rank(self) -> int:
        return self.environment.local_rank

    @property
    def world_size(self) -> int:
        return self.environment.world_size

    @property
    def local_size(self) -> int:
        return self.environment.local_size

    @property
    def is_rank_zero(self) -> bool:
        return self.rank == 0

    @property
    def device(self) -> Any:
        """Where the model computes: a torch.device, or TensorFlow's device name."""
        return self.environment.device

    @property
    def host(self) -> str:
        """This rank's host, as horovodrun named it (-H, --hostfile), else the machine's name."""
        return self.environment.host

    @property
    def threads(self) -> int:
        """This rank's share of the host's CPU cores."""
        return self.environment.threads

    # The model and the optimizer.
    def setup(
        self, model: Any, optimizer: Any, *, horovod: ExchangeSettings | None = None,
        compression: str | None = None, overlap: bool | str | None = None,
        backward_passes_per_step: int | None = None, shard: str | None = None,
        gradient_clip_norm: float = 0.0, scale_learning_rate: str = "none",
        precision: str | None = None, loss: Loss = "cross_entropy", layout: Layout | None = None,
    ) -> tuple[Any, Any]:  # fmt: skip
        """Takes the model onto this rank's device and makes the optimizer distributed, and
        gives every rank rank 0's weights and optimizer state (under horovodrun's elastic
        mode, the elastic state's sync does that instead). Returns the model and the
        optimizer, the same objects: the optimizer's step now averages the gradients over the
        ranks (under TensorFlow, its `apply_gradients`, which `model.fit` calls too).

        `optimizer`: the framework's own (over the model's trainable parameters, each once),
        or an `hvd_train.Optimizer(...)` table, made as a recipe's. How the gradients travel
        is a recipe's `[horovod]` table: `horovod`, an `hvd_train.ExchangeSettings(...)`, or
        its keys given here: `compression` ("none", "fp16", "bf16": how gradients travel),
        `overlap` (True, False, "auto": in buckets while the last backward pass goes on),
        `backward_passes_per_step` (the passes whose gradients add up locally before a step
        averages them), `shard` ("optimizer": each rank keeps the optimizer state of its part
        of the parameters only, and updates that part; "gradients": and of the averaged
        gradients, which it alone receives; "none"; docs/sharding.md). `gradient_clip_norm`:
        the averaged gradients' norm is clipped to it (0: not clipped). `scale_learning_rate`
        ("linear", "sqrt": the rates times the global batch's growth, world size x backward
        passes per step, or its root; "none"). `precision`: the one given when this was made,
        unless given here. `loss`: what the exchange's `step` and `eval_batch` compute
        ("cross_entropy" on logits, or a function `(outputs, labels) -> mean loss`). `layout`:
        how checkpoints hold the weights (hvd_train's builders give a recipe's model one; a
        loop's own model keeps the framework's)."""
        keys = {"compression": compression, "overlap": overlap, "shard": shard,
                "backward_passes_per_step": backward_passes_per_step}  # fmt: skip
        given: dict[str, Any] = {key: value for key, value in keys.items() if value is not None}
        if horovod is not None and given:
            raise UsageError(
                f"setup: give the [horovod] table's settings either as horovod= or as keywords "
                f"({', '.join(given)}), not both"
            )
        settings = horovod or ExchangeSettings(**given)
        clip = Rule(kind=float, minimum=0.0).check("gradient_clip_norm", gradient_clip_norm)
        scaling = Rule(kind=str, choices=LR_SCALING).check(
            "scale_learning_rate", scale_learning_rate
        )
        if precision is not None:
            self.precision = Precision(precision)
        made = self.exchange.setup(model, optimizer, settings, clip_norm=clip, scaling=scaling,
                                   loss=loss, precision=self.precision)  # fmt: skip
        self.checkpoints.layout = layout
        return made

    @property
    def learning_rate(self) -> float:
        """The optimizer's one-process learning rate (its first group's), which a schedule
        scales and warms up."""
        return self.exchange.learning_rate

    def backward(self, loss: Any) -> None:
        """The backward pass of `loss` (torch): `loss.backward()`, with the loss scaled first
        under fp16-mixed, where it must be called instead."""
        self.exchange.backward(loss)

    @contextmanager
    def no_sync(self) -> Iterator[None]:
        """Backward passes whose gradients stay on this rank, adding up in .grad, until a pass
        outside (torch): local accumulation, without the exchange's traffic. As DDP's, a step
        taken inside updates with this rank's own gradients."""
        with self.exchange.no_sync():
            yield

    # The data.
    def loader(self, dataset: Any, batch_size: int, *, shuffle: bool = True, seed: int = 0,
               workers: int | str = "auto", prefetch: int = 2,
               transforms: Sequence[dict[str, Any]] | Transforms = (),
               timeout: float = DEFAULT_TIMEOUT, passes: int = 1,
               limit: int | None = None) -> Loader:  # fmt: skip
        """This rank's batches of `dataset` (`(inputs, labels)` arrays, a Hugging Face dataset,
        a split of `hvd_train.Data(...).load()`, or any object with `len()` whose `[indices]`
        gives `(inputs, labels)`), read ahead by `workers` threads up to `prefetch` batches
        (as a recipe's `[data]` keys say), as the framework's tensors. With `shuffle`, a
        training loader: a disjoint slice per rank in a new order each epoch (`set_epoch`),
        all ranks the same number of steps (of `passes` batches each, at most `limit` an
        epoch), `transforms` (a recipe's `[data] transforms` tables) applied, each example's
        random numbers from the seed; without, each rank a slice of the examples, every one
        once, with the deterministic transforms only."""
        made = Loader(self.environment.backend, dataset, batch_size, shuffle=shuffle, seed=seed,
                      workers=workers, prefetch=prefetch, transforms=transforms,
                      timeout=timeout, threads=self.threads, passes=passes,
                      limit=limit)  # fmt: skip
        if shuffle:
            self.checkpoints.global_batch = made.global_batch
        return made

    # Collectives: every rank calls each, in the same order.
    def all_reduce(self, value: Any, op: str = "mean") -> Any:
        """`value` reduced over the ranks by `op` ("mean", "sum", "min", "max"): a tensor of the
        framework (by Horovod, on the device), or a number or array (in float64, in rank
        order: bit for bit the same on every rank)."""
        return self.collectives.all_reduce(value, op)

    def all_gather(self, value: Any) -> Any:
        """Every rank's `value`: tensors of the framework joined along their first axis (by
        Horovod), anything else (picklable) as a list in rank order."""
        return self.collectives.all_gather(value)

    def broadcast(self, value: Any, root: int = 0) -> Any:
        """Rank `root`'s `value` on every rank: a tensor of the framework, or any picklable
        object."""
        return self.collectives.broadcast(value, root)

    def barrier(self) -> None:
        """Waits until every rank is here."""
        self.collectives.barrier()

    def on_rank_zero(self, action: Callable[[], T]) -> T:
        """Runs `action` on rank 0 and hands its result, or its UsageError, to every rank, so a
        mistake found on rank 0 stops all ranks at once instead of leaving them in a collective."""
        return self.collectives.on_rank_zero(action)

    # Rank 0 speaks.
    def print(self, *values: Any, **options: Any) -> None:
        """`print`, on rank 0 only."""
        if self.is_rank_zero:
            print(*values, **options, flush=True)

    def logger(self, name: str | None = None) -> logging.Logger:
        """The logger `name`, whose records rank 0 alone emits."""
        return self.environment.logger(name)

    # Checkpoints: hvd_train's format, which `hvd-train eval` and `export` read.
    def save(self, directory: str | Path, state: dict[str, Any], *, recipe: str | None = None,
             keep: int = 3) -> Path:  # fmt: skip
        """Saves `state` into `directory`'s checkpoints/ (every rank calls it; rank 0 writes,
        atomically, with checksums, keeping the newest `keep`): its "model" and "optimizer"
        (the ones `setup` returned), and the loop's own values beside them (numbers, strings,
        lists, dicts), which every rank must hold alike. "epoch" and "step" (the steps done in
        it) name the checkpoint. `recipe`: a Python recipe file that names the model and its
        data, for `hvd-train eval` and `export` to rebuild the model. Its path, on every rank."""
        path = self.checkpoints.save(directory, state, recipe=recipe, keep=keep)
        assert path is not None  # not ranked among the best: always written
        return path

    def load(self, path: str | Path) -> dict[str, Any] | None:
        """Loads the checkpoint at `path` (one, or the newest sound one of a run's folder) into
        the model and the optimizer `setup` returned, on every rank; returns the loop's values
        saved with it (None where the folder holds no checkpoint). A checkpoint of another
        model, or of the other framework, is one line."""
        self.exchange.needs_setup("load")
        found = self.checkpoints.find(path)
        if found is None:
            return None
        kept = found.state
        if kept["framework"] != self.framework or kept["layout"] != self.exchange.layout:
            raise UsageError(
                f"checkpoint {found.path} holds a {kept['framework']} model's state "
                f"({kept['layout']} weights), and this loop trains a {self.framework} model; "
                "load it into the model that wrote it",
                every_rank=True,
            )
        self.checkpoints.load(found, remedy="load it into the model and optimizer that wrote it")
        return dict(kept.get("loop", {}))

    def check_replicas(self, where: str = "") -> None:
        """Every rank must hold the same trained weights and optimizer state, bit for bit; a
        difference means the replicas diverged (a bug in the loop, hvd_train, Horovod or the
        model), which would otherwise train on silently: `ReplicasDiverged`, naming the first
        tensor and rank that differ."""
        self.exchange.check_replicas(where)
