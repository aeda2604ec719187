"""ZeRO's sharding under torch, through Horovod's collectives (`[horovod] shard`).

With "optimizer" (ZeRO-1) the gradients are averaged as ever, and each rank updates only its
part of the parameters, so it keeps the optimizer state of that part only; the updated parts
reach every rank by an allgather per bucket. With "gradients" (ZeRO-2) each bucket of
gradients is reduce-scattered instead of allreduced, so a rank receives, and keeps, only the
averages of its part, and lets a bucket's full gradients go as soon as they are sent.

The parts follow the exchange's buckets: rank r holds the r-th of N cuts of each bucket (the
parameters' elements end to end, in the order the backward pass fills them). An element-wise
optimizer (SGD, Adam, ...) updates a cut parameter's piece exactly as it would the whole, so
the cuts fall near even ones, on a multiple of 64 elements into their parameter; any other
(LAMB takes a whole tensor's norm) gets whole parameters, the cuts falling at the parameters'
edges that even out what each rank holds over all the buckets. Where a bucket is
reduce-scattered, each cut is padded to the longest (Horovod splits a tensor evenly). The
optimizer the loop made stays the loop's object: its groups hold this rank's pieces instead of
the parameters (views of them, so its update lands in the model), and a schedule made for it
goes on working. Where the step allows (`Stepping.early`), each bucket's pieces are updated as
their averages arrive, in the backward pass, and their allgather leaves at once, so that the
weights travel behind the pass. docs/sharding.md says more.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import horovod.torch as hvd
import numpy as np
import torch

from hvd_train.distributed.checkpoint_files import Arrays
from hvd_train.distributed.sharding import Partition, Piece
from hvd_train.distributed.torch.exchange import (
    Bucketed,
    average_async,
    in_memory_order,
    laid_out,
    squared_norm,
)
from hvd_train.distributed.torch.optimizers import (
    GROUP,
    Entries,
    OptimizerState,
    group_settings,
    load_group_settings,
    per_parameter,
)

# torch's optimizers whose update of an element reads that element's gradient and state alone,
# and numbers (the step count) that are the same for every element: a piece of a parameter is
# updated as it would be within the whole.
ELEMENT_WISE = (
    torch.optim.SGD, torch.optim.Adam, torch.optim.AdamW, torch.optim.RMSprop, torch.optim.Adagrad,
    torch.optim.Adamax, torch.optim.NAdam, torch.optim.RAdam, torch.optim.Adadelta,
    torch.optim.Rprop, torch.optim.ASGD,
)  # fmt: skip

# The bytes of the buffers a rank keeps on their way (reduce-scattered gradients, gathered
# weights) while it goes on, beside the last bucket sent: more hold more at once, fewer keep
# the backward pass waiting on a slow link (docs/history.md, "Sharding").
IN_FLIGHT_BYTES = 32 * 2**20


def partition(parameters: list[torch.Tensor], buckets: list[list[int]], ranks: int,
              whole: bool) -> Partition:  # fmt: skip
    """The cuts of the exchange's `buckets` of `parameters` among `ranks`."""
    return Partition([p.numel() for p in parameters], buckets, ranks, whole)


def waited(sizes: list[int]) -> int:
    """Of the buffers on their way (their bytes, the first sent first), how many of the first
    must arrive before the rank goes on: all but the last ones that IN_FLIGHT_BYTES holds
    (the last sent always travels)."""
    held = 0
    for number in reversed(range(len(sizes))):
        held += sizes[number]
        if held > IN_FLIGHT_BYTES and number < len(sizes) - 1:
            return number + 1
    return 0


def flat_gradient(gradients: torch.Tensor, partition: Partition, rank: int, bucket: int,
                  piece: Piece) -> torch.Tensor:  # fmt: skip
    """Where `piece`'s averaged gradient lies among all the gradients end to end (ZeRO-1)."""
    at = partition.flat_offsets[bucket] + partition.cuts[bucket][rank] + piece.at
    return gradients[at : at + piece.stop - piece.start]


class TorchShards:
    """This rank's pieces of the parameters, which the optimizer now holds in their place;
    `gradient(bucket, piece)`: where each piece's averaged gradient lies (a 1-D view)."""

    def __init__(self, parameters: list[torch.Tensor], partition: Partition, rank: int,
                 optimizer: torch.optim.Optimizer,
                 gradient: Callable[[int, Piece], torch.Tensor]) -> None:  # fmt: skip
        self.parameters, self.partition, self.rank = parameters, partition, rank
        self.memory = [in_memory_order(p.detach()) for p in parameters]
        self.nothing = self.memory[0][:0]  # what a rank holding no piece of a bucket sends
        self.held = partition.pieces(rank)
        self.tensors: dict[int, torch.Tensor] = {}  # per parameter held, its piece as optimized
        self.pieces: dict[int, Piece] = {}
        for bucket, pieces in enumerate(self.held):
            for piece in pieces:
                self.pieces[piece.index] = piece
                parameter = parameters[piece.index]
                whole = piece.stop - piece.start == parameter.numel()
                values = self.memory[piece.index][piece.start : piece.stop]
                tensor = laid_out(values, parameter) if whole else values
                grad = gradient(bucket, piece)
                tensor.grad = laid_out(grad, parameter) if whole else grad
                self.tensors[piece.index] = tensor
        positions = {id(p): index for index, p in enumerate(parameters)}
        bucket_of = {p.index: bucket for bucket, pieces in enumerate(self.held) for p in pieces}
        self.order: list[int] = []  # the parameters held, in the optimizer's order
        # Per bucket, per group of the optimizer, the pieces it holds (what `update` steps).
        self.grouped: list[list[list[torch.Tensor]]] = [[] for _ in self.held]
        for group in optimizer.param_groups:
            indices = [positions[id(p)] for p in group["params"]]
            indices = [i for i in indices if i in self.tensors]
            group["params"] = [self.tensors[i] for i in indices]
            self.order += indices
            for bucket, grouped in enumerate(self.grouped):
                grouped.append([self.tensors[i] for i in indices if bucket_of[i] == bucket])
        optimizer.state.clear()
        self.optimizer = optimizer
        self.element_wise = type(optimizer) in ELEMENT_WISE
        # A bucket, its allgather's handle, and the bytes it brings.
        self.gathering: list[tuple[int, Any, int]] = []
        self.updated: set[int] = set()  # the buckets `update` updated in this step
        self.gradients = [t.grad for t in self.tensors.values() if t.grad is not None]

    def norm(self) -> torch.Tensor:
        """The norm of the whole averaged gradients, from every rank's pieces."""
        squares = squared_norm(self.gradients)
        total = hvd.allreduce(squares, op=hvd.Sum, name="hvd_train.norm")
        return total.sqrt().to(self.parameters[0].dtype)

    def agree_on_overflow(self, scaler: torch.amp.GradScaler,
                          optimizer: torch.optim.Optimizer) -> None:  # fmt: skip
        """Under fp16-mixed each rank unscaled its part only: every rank skips the step where
        any part overflowed (the flags GradScaler found, maxed over the ranks; GradScaler keeps
        them per optimizer in its own `_per_optimizer_states`, which its step reads)."""
        found = scaler._per_optimizer_states[id(optimizer)]["found_inf_per_device"]
        flags = [flag.float().cpu() for flag in found.values()]
        mine = torch.stack(flags).amax() if flags else torch.zeros(())
        agreed = hvd.allreduce(mine.reshape(1), op=hvd.Max, name="hvd_train.overflow")
        device = self.parameters[0].device
        for flag in found.values():
            flag.fill_(float(agreed))
        if not found:  # this rank holds nothing: it steps, or skips, with the others
            found[device] = agreed.reshape(()).to(device)

    def update(self, bucket: int, step: Callable[[], Any]) -> None:
        """The optimizer's `step` over this rank's pieces of `bucket` alone, as soon as their
        averages are in; then the pieces on their way to every rank (`send`), beside those
        of other buckets within IN_FLIGHT_BYTES."""
        groups = self.optimizer.param_groups
        kept = [group["params"] for group in groups]
        try:
            for group, params in zip(groups, self.grouped[bucket], strict=True):
                group["params"] = params
            if self.held[bucket]:
                step()
        finally:
            for group, params in zip(groups, kept, strict=True):
                group["params"] = params
        self.updated.add(bucket)
        self.send(bucket)
        self.land(waited([size for _, _, size in self.gathering]))

    def send(self, bucket: int) -> None:
        """This rank's pieces of `bucket`, updated, on their way to every rank (an
        allgather)."""
        parts = [self.memory[p.index][p.start : p.stop] for p in self.held[bucket]]
        sent = parts[0] if len(parts) == 1 else torch.cat(parts or [self.nothing])
        handle = hvd.allgather_async(sent, name=f"hvd_train.weights.{bucket}")
        size = self.partition.cuts[bucket][-1] * self.nothing.element_size()
        self.gathering.append((bucket, handle, size))

    def land(self, least: int) -> None:
        """The buckets whose allgather Horovod is done with into every rank's parameters: at
        least the `least` sent first (waiting for them), and any other that is done."""
        partition, kept = self.partition, []
        try:
            for number, entry in enumerate(self.gathering):
                bucket, handle, _ = entry
                if number >= least and not hvd.poll(handle):
                    kept.append(entry)
                    continue
                whole, starts = hvd.synchronize(handle), partition.starts[bucket]
                with torch.no_grad():
                    for index in partition.buckets[bucket]:
                        size, start = partition.sizes[index], starts[index]
                        self.memory[index].copy_(whole[start : start + size])
        finally:
            # A wait that fails must not leave its handles to a later step.
            self.gathering = kept

    def gather(self) -> None:
        """Every rank's updated pieces into every rank's parameters: an allgather for each
        bucket not sent yet (by `update`), with no more than IN_FLIGHT_BYTES of them on their
        way (beside the last), so that little is held twice; then every bucket landed."""
        for bucket in range(len(self.held)):
            if bucket not in self.updated:
                self.send(bucket)
                self.land(waited([size for _, _, size in self.gathering]))
        self.land(len(self.gathering))
        self.updated.clear()


class ScatteringExchange(Bucketed):
    """ZeRO-2's exchange: each bucket's gradients, once they have all arrived in the step's last
    backward pass, are copied into a buffer of the bucket's cuts end to end (each padded to the
    longest), their .grad let go, and reduce-scattered, averaging: this rank keeps the averages
    of its cut only, in `gradients`. Its buffers go as soon as Horovod is done with them. A
    bucket leaves as it fills unless overlap is off (then all wait for the step, and the whole
    gradients are held until then). The control values travel in an allreduce of their own."""

    last_waits = False

    def __init__(self, parameters: list[torch.Tensor], ranks: int, rank: int, whole: bool,
                 travel: torch.dtype | None, device: torch.device, passes: int,
                 overlap: bool | str, exchanges: bool) -> None:  # fmt: skip
        self.rank, self.travel, self.device = rank, travel, device
        self.sent: list[tuple[int, Any, int]] = []  # a bucket, its handle, its buffer's bytes
        # "auto" weighs time alone; here a bucket that leaves as it fills also lets its
        # gradients go before the pass ends, which is what sharding them is for.
        super().__init__(parameters, passes, True if overlap == "auto" else overlap, exchanges)
        self.partition = partition(parameters, self.buckets, ranks, whole)
        self.gradients = torch.zeros(self.partition.offsets[-1], dtype=self.dtype, device=device)
        self.clear()

    def gradient(self, bucket: int, piece: Piece) -> torch.Tensor:
        """Where `piece`'s averaged gradient lies, in this rank's cut of `bucket`."""
        at = self.partition.offsets[bucket] + piece.at
        return self.gradients[at : at + piece.stop - piece.start]

    def clear(self) -> None:
        for parameter in self.parameters:
            parameter.grad = None
        self.reached[:] = False
        self.unsent = set(range(len(self.buckets)))
        self.began = time.perf_counter()

    def _send_bucket(self, bucket: int) -> None:
        partition, width = self.partition, self.partition.widths[bucket]
        cuts, starts = partition.cuts[bucket], partition.starts[bucket]
        travel = self.travel or self.dtype
        buffer = torch.zeros(partition.ranks * width, dtype=travel, device=self.device)
        for index in self.buckets[bucket]:
            parameter, grad = self.parameters[index], self.parameters[index].grad
            parameter.grad = None
            if grad is None:
                continue  # zeros: another rank may have a gradient
            if grad.stride() == parameter.stride():  # as autograd lays it out
                values = in_memory_order(grad)
            else:
                values = torch.empty(parameter.numel(), dtype=grad.dtype, device=self.device)
                laid_out(values, parameter).copy_(grad)
            first = starts[index]
            for rank in range(partition.ranks):
                low = max(cuts[rank], first)
                high = min(cuts[rank + 1], first + parameter.numel())
                if low < high:
                    at = rank * width + low - cuts[rank]
                    buffer[at : at + high - low] = values[low - first : high - first]
        self.unsent.discard(bucket)
        handle = hvd.reducescatter_async(buffer, op=hvd.Average, name=f"hvd_train.scatter.{bucket}")
        self.sent.append((bucket, handle, buffer.numel() * buffer.element_size()))
        self._collect(waited([size for _, _, size in self.sent]))

    def _collect(self, least: int) -> None:
        """The averaged cuts Horovod is done with into `gradients`: at least the `least` sent
        first (waiting for them), and any other that is done."""
        kept = []
        for number, entry in enumerate(self.sent):
            bucket, handle, _ = entry
            if number >= least and not hvd.poll(handle):
                kept.append(entry)
                continue
            received = hvd.synchronize(handle)
            cuts, at = self.partition.cuts[bucket], self.partition.offsets[bucket]
            mine = cuts[self.rank + 1] - cuts[self.rank]
            self.gradients[at : at + mine].copy_(received[:mine])
            if self.landed is not None:
                self.landed(bucket)
        self.sent = kept

    def _average(self, control: np.ndarray) -> np.ndarray:
        control_handle = average_async(control)
        for bucket in sorted(self.unsent):
            self._send_bucket(bucket)
        try:
            self._collect(len(self.sent))
        finally:
            # A wait that fails must not leave its handles to a later step.
            self.sent = []
        return hvd.synchronize(control_handle).numpy()


class ShardedState:
    """The optimizer's state of a sharded run as every checkpoint holds one (`OptimizerState`'s
    arrays: each parameter's whole state, keyed by its place), gathered from every rank's
    pieces onto rank 0 a bucket at a time; and a whole state, loaded on rank 0, cut into every
    rank's pieces as it is handed out (`broadcast`), a bucket at a time. So a checkpoint does
    not say how it was sharded, and resumes sharded or not, at any world size."""

    def __init__(self, optimizer: torch.optim.Optimizer, shards: TorchShards,
                 whole: OptimizerState) -> None:  # fmt: skip
        self.optimizer, self.shards, self.whole = optimizer, shards, whole
        self.pending: Arrays | None = None  # a whole state loaded here, not yet handed out

    def _kind(self, index: int, value: torch.Tensor) -> tuple[str, tuple[int, ...]]:
        """How a state tensor relates to its piece: "elements" (one per element; the
        parameter's shape), "scalar", or "whole" (of a parameter held whole, in its own
        shape)."""
        if value.dim() == 0:
            return "scalar", ()
        if value.shape == self.shards.tensors[index].shape:
            return "elements", tuple(self.shards.parameters[index].shape)
        return "whole", tuple(value.shape)

    def arrays(self) -> Arrays:
        """The whole state on rank 0 (nothing on the others); every rank calls it."""
        held = {
            (index, key): (*self._kind(index, value), str(value.dtype).removeprefix("torch."))
            for index, tensor in self.shards.tensors.items()
            for key, value in map(_as_tensor, self.optimizer.state.get(tensor, {}).items())
        }
        layout: dict[tuple[int, str], tuple[str, tuple[int, ...], str]] = {}
        for theirs in hvd.allgather_object(held, name="hvd_train.optimizer_layout"):
            layout |= theirs
        arrays: Arrays = {}
        for indices in self.shards.partition.buckets:
            names = sorted(name for name in layout if name[0] in indices)
            handles = [hvd.allgather_async(self._sent(index, key, layout[index, key]),
                                           name=f"hvd_train.state.{index}.{key}")
                       for index, key in names]  # fmt: skip
            for (index, key), handle in zip(names, handles, strict=True):
                values = hvd.synchronize(handle)
                if hvd.rank() != 0:
                    continue  # only rank 0 keeps the whole state
                kind, shape, _ = layout[index, key]
                if kind == "elements":
                    values = laid_out(values, self.shards.parameters[index])
                values = values[:1].reshape(()) if kind == "scalar" else values.reshape(shape)
                arrays[f"{index}.{key}"] = values.cpu().numpy().copy()
        if hvd.rank() != 0:
            return arrays
        return arrays | self.whole.scaler_arrays() | group_settings(self.optimizer)

    def _sent(self, index: int, key: str, described: tuple[str, tuple[int, ...], str]
              ) -> torch.Tensor:  # fmt: skip
        """What this rank holds of parameter `index`'s state `key` (`described`: its kind, shape
        and dtype), flat (in memory order, where it has one per element); nothing where it
        holds none."""
        kind, _, dtype = described
        tensor = self.shards.tensors.get(index)
        value = None if tensor is None else self.optimizer.state.get(tensor, {}).get(key)
        if tensor is None or value is None:
            return torch.zeros(0, dtype=getattr(torch, dtype))
        value = torch.as_tensor(value).detach()
        if kind != "elements":
            return value.reshape(-1)
        if value.stride() == tensor.stride():  # as the optimizer lays it out
            return in_memory_order(value)
        flat = torch.empty(value.numel(), dtype=value.dtype, device=value.device)
        laid_out(flat, tensor).copy_(value)
        return flat

    def load(self, state: Arrays) -> None:
        """Checks `state` (a whole state) and keeps it to hand out (`broadcast`); this rank's
        pieces take theirs at once."""
        entries = self.whole.check(state)
        self.whole.load_scaler(state)
        load_group_settings(self.optimizer, state)
        self.pending = state
        self._load(self._cut(entries))

    def _cut(self, entries: Entries) -> Entries:
        """This rank's pieces' state out of whole parameters' `entries` (copies: the whole may
        go)."""
        cut: Entries = {}
        for index, values in entries.items():
            if index not in self.shards.tensors:
                continue
            parameter, tensor = self.shards.parameters[index], self.shards.tensors[index]
            piece = self.shards.pieces[index]
            for key, value in values.items():
                if value.dim() and tuple(value.shape) == tuple(parameter.shape):
                    flat = torch.empty(value.numel(), dtype=value.dtype)
                    laid_out(flat, parameter).copy_(value)
                    value = flat[piece.start : piece.stop].clone()
                    value = laid_out(value, parameter) if value.shape != tensor.shape else value
                else:
                    value = value.clone()
                cut.setdefault(index, {})[key] = value
        return cut

    def _load(self, entries: Entries) -> None:
        ordered = {at: entries[index] for at, index in enumerate(self.shards.order)
                   if index in entries}  # fmt: skip
        current = self.optimizer.state_dict()["param_groups"]
        self.optimizer.load_state_dict({"state": ordered, "param_groups": current})

    def broadcast(self) -> None:
        """Rank 0's whole state, where it loaded one, cut into every rank's pieces, a bucket
        at a time; and its loss scale."""
        pending = self.pending if hvd.rank() == 0 else None
        layout = None if pending is None else {n: (a.shape, a.dtype.str) for n, a in pending.items()
                                               if not n.startswith(("scaler.", GROUP))}  # fmt: skip
        layout = hvd.broadcast_object(layout, root_rank=0, name="hvd_train.optimizer")
        self.whole.broadcast_scaler()
        self.whole.broadcast_groups()
        self.pending = None
        if layout is None:
            return
        entries: Entries = {}
        for indices in self.shards.partition.buckets:
            names = [name for name in layout if int(name.split(".")[0]) in indices]
            handed = {}
            for name in names:
                shape, dtype = layout[name]
                array = np.zeros(shape, dtype) if pending is None else np.array(pending[name])
                tensor = torch.from_numpy(array)
                handle = hvd.broadcast_async_(tensor, 0, name=f"hvd_train.optimizer.{name}")
                handed[name] = (tensor, handle)
            for _, handle in handed.values():
                hvd.synchronize(handle)
            whole = per_parameter({n: t.numpy() for n, (t, _) in handed.items()})
            for index, values in self._cut(whole).items():
                entries.setdefault(index, {}).update(values)
        self._load(entries)


def _as_tensor(item: tuple[str, Any]) -> tuple[str, torch.Tensor]:
    return item[0], torch.as_tensor(item[1])
