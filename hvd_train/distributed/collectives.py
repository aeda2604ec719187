"""The collectives every rank calls, in the same order: of the framework's tensors (through
Horovod, on the device) and of numbers, arrays and small objects (through Horovod's object
collectives), and rank 0's work handed to every rank."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from hvd_train.distributed.backend import Backend, T
from hvd_train.errors import UsageError
from hvd_train.recipe.rules import Rule

# The name of every object broadcast and allgather. Horovod matches collectives across ranks by
# name, and its object collectives default to the object's type name: ranks that pass None and a
# string (a failure on one rank only) would wait for each other for ever.
OBJECT_COLLECTIVE = "hvd_train.object"
OPS = ("mean", "sum", "min", "max")  # what all_reduce computes


class Collectives:
    def __init__(self, backend: Backend) -> None:
        self.backend = backend

    def all_reduce(self, value: Any, op: str = "mean") -> Any:
        """`value` reduced over the ranks by `op` ("mean", "sum", "min", "max"): a tensor of the
        framework (by Horovod, on the device), or a number or array (in float64, in rank
        order: bit for bit the same on every rank)."""
        Rule(kind=str, choices=OPS).check("all_reduce: op", op)
        if self.backend.is_tensor(value):
            hvd = self.backend.hvd
            ops = {"mean": hvd.Average, "sum": hvd.Sum, "min": hvd.Min, "max": hvd.Max}
            return hvd.allreduce(value, op=ops[op])
        mine, problem = None, None
        try:
            mine = np.asarray(value, dtype=np.float64)
        except (TypeError, ValueError):
            shown = repr(value) if len(repr(value)) <= 40 else type(value).__name__
            problem = (
                f"all_reduce: {shown} is not a number; give numbers, arrays of numbers or "
                "the framework's tensors (all_gather and broadcast take any object)"
            )
        everyone = self.all_gather((problem, mine))
        for rank, (their_problem, _) in enumerate(everyone):
            if their_problem is not None:
                on_rank = f"rank {rank}: " if len(everyone) > 1 else ""
                raise UsageError(f"{on_rank}{their_problem}", every_rank=True)
        shapes = [np.shape(array) for _, array in everyone]
        if len(set(shapes)) > 1:
            rank = next(rank for rank, shape in enumerate(shapes) if shape != shapes[0])
            raise UsageError(f"all_reduce: rank {rank} gives a value of shape {shapes[rank]}, "
                             f"rank 0 one of {shapes[0]}; reduce values of one shape on every "
                             "rank", every_rank=True)  # fmt: skip
        gathered = np.stack([array for _, array in everyone])
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
        if self.backend.rank == 0:
            try:
                outcome = (action(), None)
            except UsageError as error:
                outcome = (None, str(error))
        result, message = self.broadcast(outcome)
        if message is not None:
            raise UsageError(message, every_rank=True)
        return result
