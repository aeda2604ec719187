"""The gradients' exchange under torch, and the optimizer that `setup` makes distributed.

The gradients live in one flat buffer: each trainable parameter's `.grad` is a view of it, laid
out in buckets (in the order the backward pass fills them), so a bucket is one slice and goes
to Horovod as one tensor, averaged in place: no copy into Horovod's fusion buffer and back
(docs/performance.md, "Gradients in place"). Compressed, a slice travels as its cast and comes
back into the buffer. With overlap, each bucket is sent from a hook as the step's last backward
pass finishes its last gradient, so its transfer overlaps the rest of the pass, as DDP's buckets
do; otherwise the whole buffer goes when the optimizer steps. The step's control values (a
loop's flags and loss, the times "auto" decides from) travel at the buffer's end, with the last
bucket.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable, Iterator
from typing import Any

import horovod.torch as hvd
import numpy as np
import torch
from torch import nn

from hvd_train.distributed.overlap import OverlapChoice, buckets
from hvd_train.errors import UsageError

# The dtype each `[horovod] compression` sends gradients as (None: as they are).
TRAVEL_DTYPES = {"none": None, "fp16": torch.float16, "bf16": torch.bfloat16}
# Room at the end of the gradients' buffer for a step's control values, which then travel with
# the last bucket.
CONTROL_SLOTS = 16
# Norms are taken in slices of this many elements, whose squares add up in float64: torch's
# float32 norm of one long tensor drifts on the CPU (docs/history.md, "The gradients' norm"),
# and a sharded step's parts would disagree with the whole.
NORM_SLICE = 2**16


def average_async(values: np.ndarray) -> Any:
    """A handle on the ranks' average of `values`, as float64, in an allreduce of their own."""
    return hvd.allreduce_async_(torch.from_numpy(values), op=hvd.Average, name="hvd_train.control")


def in_memory_order(tensor: torch.Tensor) -> torch.Tensor:
    """A dense tensor's elements as they lie in memory, as a 1-D view (the order of its
    gradient's slice of a bucket, whatever its layout: channels-last, for one)."""
    return tensor.as_strided((tensor.numel(),), (1,), tensor.storage_offset())


def squared_norm(tensors: list[torch.Tensor]) -> torch.Tensor:
    """The sum of the squares of dense `tensors`' elements, as float64."""
    slices = [part for t in tensors for part in in_memory_order(t).split(NORM_SLICE)]
    if not slices:
        return torch.zeros((), dtype=torch.float64)
    return torch.stack(torch._foreach_norm(slices)).double().square().sum()


def laid_out(values: torch.Tensor, parameter: torch.Tensor) -> torch.Tensor:
    """`values` (as many as `parameter` has) in its shape and memory layout (channels-last, for
    one), as autograd lays out a gradient for it: what DDP's bucket views do."""
    strides = torch.empty_like(parameter, device="meta").stride()  # dense layouts kept
    return values.as_strided(parameter.shape, strides)


class Bucketed:
    """What a step's exchange keeps track of, whatever travels: the gradients in buckets (in the
    order the backward pass fills them), each of which leaves once its gradients have all
    arrived in the step's last backward pass (the `passes`-th, counting each gradient's arrival
    outside `no_sync`), from its hook where the step overlaps; overlap's choice; and the step's
    control values, once averaged. A subclass says what leaves (`_send_bucket`), what arrives
    back (`_average`) and where the gradients live (`clear`, `_claim`). Alone (one rank, not
    elastic), nothing travels.

    It also learns which parameters no pass since the gradients were zeroed reached, on any
    rank (`unreached`): their gradients travel as zeros, as another rank may have one, and the
    step then skips them, as plain torch skips a parameter whose .grad is None. How many this
    rank left out travels with the control values; only where some rank left one out does an
    allreduce of which follow."""

    # Whether the last bucket waits for the step (it carries the control values).
    last_waits = True
    gradients: torch.Tensor  # where the optimizer reads the averages (all, or this rank's part)
    # Sharded: called as a bucket leaves within the backward pass, and with each bucket whose
    # averages are in place, as soon as they are.
    leaving: Callable[[], None] | None = None
    landed: Callable[[int], None] | None = None

    def __init__(self, parameters: list[torch.Tensor], passes: int, overlap: bool | str,
                 exchanges: bool) -> None:  # fmt: skip
        self.parameters, self.passes, self.exchanges = parameters, passes, exchanges
        dtypes = sorted({str(p.dtype).removeprefix("torch.") for p in parameters})
        if len(dtypes) > 1:
            raise UsageError(
                f"the model trains parameters of several dtypes ({', '.join(dtypes)}), and their "
                "gradients share one buffer: give them one dtype (module.float())"
            )
        self.dtype = parameters[0].dtype if parameters else torch.float32
        self.buckets = buckets([p.numel() * p.element_size() for p in parameters])
        self.choice = OverlapChoice(overlap, len(self.buckets))
        self.holding = False  # in no_sync: gradients arrive without counting
        self.began = time.perf_counter()
        self.reached = np.zeros(len(parameters), dtype=bool)  # per parameter, since zeroed
        self.stepped()
        for bucket, indices in enumerate(self.buckets):
            for index in indices:
                self.parameters[index].register_post_accumulate_grad_hook(
                    functools.partial(self._accumulated, bucket, index)
                )

    def stepped(self) -> None:
        """The step is over: the next one counts its gradients' arrivals anew."""
        self.arrived = [0] * len(self.buckets)  # per bucket: its gradients in the step
        self.first_full: float | None = None  # when the last pass filled its first bucket
        self.averaged: np.ndarray | None = None  # the step's control values, once averaged
        self.unreached: list[int] = []  # the parameters no rank reached, once averaged
        self.deferred: list[int] = []  # buckets landed early, to update in the step (`landed`)

    def full(self, bucket: int) -> bool:
        """Whether all of `bucket`'s gradients arrived in the step's last pass."""
        return self.arrived[bucket] == len(self.buckets[bucket]) * self.passes

    def _accumulated(self, bucket: int, index: int, parameter: torch.Tensor) -> None:
        """A gradient arrived (`_arrived`); a bucket whose gradients have all arrived in the
        step's last pass leaves, where the step overlaps. A pass past the step's last, outside
        `no_sync`, is refused (as Horovod's DistributedOptimizer refuses it): its gradients
        would meet averages that may have left already."""
        self.reached[index] = True
        self._arrived(index, parameter)
        if self.landed is not None:
            self._collect(0)  # what has arrived goes on at once (its update, sharded)
        if self.holding:
            return
        self.arrived[bucket] += 1
        if self.arrived[bucket] > len(self.buckets[bucket]) * self.passes:
            raise UsageError(
                f"backward: pass {self.passes + 1} of a step that takes {self.passes}: its "
                "gradients would join averages already on their way; take each pass but the "
                "step's last inside `with dist.no_sync():` (or setup(..., "
                "backward_passes_per_step=N)), and optimizer.step() after the last",
                every_rank=True,
            )
        if len(self.buckets) > 1 and self.full(bucket):
            self.first_full = self.first_full or time.perf_counter()
            waits = self.last_waits and bucket == len(self.buckets) - 1
            if self.choice.overlap and self.exchanges and not waits:
                if self.leaving is not None:
                    self.leaving()
                self._send_bucket(bucket)

    def clear(self) -> None:
        """Zero gradients; the time the step's passes begin."""
        raise NotImplementedError

    def _arrived(self, index: int, parameter: torch.Tensor) -> None:
        """What a subclass does with a gradient as it arrives."""

    def _send_bucket(self, bucket: int) -> None:
        raise NotImplementedError

    def _collect(self, least: int) -> None:
        """What has arrived into place: at least the `least` sent first (waiting for them),
        and any other that is done."""
        raise NotImplementedError

    def _claim(self) -> None:
        """What a subclass does with the gradients before the step sends what is left."""

    def _average(self, control: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def synchronize(self, carry: np.ndarray | None = None) -> np.ndarray:
        """Once per step, after its backward passes: sends what is not on its way yet, waits,
        and leaves the averages where the optimizer reads them; `carry` travels with them, and
        while "auto" decides, the step's times. Returns the averaged `carry` (again, when
        called again in the same step)."""
        if self.averaged is not None:
            return self.averaged
        started = time.perf_counter()
        self.deferred = []  # none kept from a step whose exchange failed
        self._claim()
        deciding = self.choice.deciding
        values = np.zeros(0) if carry is None else carry
        values = np.append(values, np.count_nonzero(~self.reached))
        if deciding:
            values = np.concatenate([values, self.choice.last])
        averaged = self._average(values) if self.exchanges else values
        if deciding:
            self.choice.record(started - self.began, time.perf_counter() - started, averaged[-2:])
            averaged = averaged[:-2]
        self.unreached = self._unreached_anywhere() if averaged[-1] > 0 else []
        self.averaged = averaged[:-1]
        return self.averaged

    def _unreached_anywhere(self) -> list[int]:
        """The parameters that no rank's passes reached (some rank left one out)."""
        if not self.exchanges:
            return np.flatnonzero(~self.reached).tolist()
        reached = torch.from_numpy(self.reached.astype(np.float64))
        counts = hvd.allreduce(reached, op=hvd.Sum, name="hvd_train.reached")
        return np.flatnonzero(counts.numpy() == 0).tolist()


class FlatExchange(Bucketed):
    """Averages the gradients over the ranks, and a step's control values with them, by
    allreduce in place: every rank gets all of them.

    A bucket that never fills (a parameter without a gradient in a pass) leaves when the
    optimizer steps. A parameter this rank left without a gradient sends zeros, as another rank
    may have one. The control values travel in slots at the buffer's end where the buffer
    travels as float32 or float64; otherwise (compressed, or a model in 16 bits) as float64 in
    an allreduce of their own, as Horovod fuses only tensors of one dtype.
    """

    def __init__(self, parameters: list[torch.Tensor], travel: torch.dtype | None,
                 device: torch.device, passes: int, overlap: bool | str,
                 exchanges: bool) -> None:  # fmt: skip
        self.travel = travel
        # The buckets in a part of `flat` on its way, the part, and its handle.
        self.sent: list[tuple[list[int], torch.Tensor, Any]] = []
        super().__init__(parameters, passes, overlap, exchanges)
        dtype = self.dtype
        self.carries_control = travel is None and dtype in (torch.float32, torch.float64)
        gradients = sum(p.numel() for p in parameters)
        room = CONTROL_SLOTS if self.carries_control else 0
        self.flat = torch.zeros(gradients + room, dtype=dtype, device=device)
        self.gradients, self.control = self.flat[:gradients], self.flat[gradients:]
        sizes = [[parameters[index].numel() for index in indices] for indices in self.buckets]
        # Per bucket, its part of `flat`; the last, sent last, with the control values.
        self.parts = list(self.gradients.split(list(map(sum, sizes))))
        self.parts[-1] = self.flat[gradients - self.parts[-1].numel() :]
        views: dict[int, torch.Tensor] = {}
        for indices, part, bucket_sizes in zip(self.buckets, self.parts, sizes, strict=True):
            views.update(zip(indices, part[: sum(bucket_sizes)].split(bucket_sizes), strict=True))
        self.views = [laid_out(views[index], p) for index, p in enumerate(parameters)]
        self.clear()

    def clear(self) -> None:
        """Zero gradients, in the buffer; the time the step's passes begin, counted anew (a
        pass whose gradients were zeroed before a step is not one of the step's)."""
        self.flat.zero_()
        self.arrived = [0] * len(self.buckets)
        self.reached[:] = False
        for parameter, view in zip(self.parameters, self.views, strict=True):
            if parameter.grad is not view:
                parameter.grad = view
        self.began = time.perf_counter()

    def _arrived(self, index: int, parameter: torch.Tensor) -> None:
        """One the loop set aside (a .grad set to None, as `module.zero_grad()` does) comes
        back into the buffer."""
        view, grad = self.views[index], parameter.grad
        if grad is not view and grad is not None:
            view.copy_(grad)
            parameter.grad = view

    def _send_bucket(self, bucket: int) -> None:
        self._send([bucket], self.parts[bucket], f"hvd_train.step.{bucket}")

    def _send(self, buckets: list[int], part: torch.Tensor, name: str) -> None:
        sent = part if self.travel is None else part.to(self.travel)
        handle = hvd.allreduce_async_(sent, op=hvd.Average, name=name)
        self.sent.append((buckets, part, handle))

    def _collect(self, least: int) -> None:
        """The averages Horovod is done with into `flat` (and `landed`): at least those of the
        `least` parts sent first (waiting for them), and any other's that is done."""
        kept = []
        for number, (landing, part, handle) in enumerate(self.sent):
            if number >= least and not hvd.poll(handle):
                kept.append((landing, part, handle))
                continue
            average = hvd.synchronize(handle)
            if self.travel is not None:
                part.copy_(average)
            landed = self.landed
            if landed is not None:
                for bucket in landing:
                    landed(bucket)
        self.sent = kept

    def _claim(self) -> None:
        """Every .grad a view of the buffer again: a gradient that arrived while a .grad was
        set aside is copied in, and none leaves zeros."""
        for parameter, view in zip(self.parameters, self.views, strict=True):
            if parameter.grad is not view:
                if parameter.grad is None:
                    view.zero_()
                else:
                    view.copy_(parameter.grad)
                parameter.grad = view

    def _average(self, control: np.ndarray) -> np.ndarray:
        """Averages the gradients, and `control` with them: in the buffer's slots, written and
        read as NumPy on the CPU (no torch op to dispatch), else in an allreduce of their own."""
        control_handle = None
        if self.carries_control:
            assert len(control) <= CONTROL_SLOTS, "more control values than CONTROL_SLOTS"
            self._write_control(control)
        else:
            control_handle = average_async(control)
        if self.choice.overlap:
            for bucket, part in enumerate(self.parts):
                if not self.full(bucket) or bucket == len(self.parts) - 1:
                    self._send([bucket], part, f"hvd_train.step.{bucket}")
        else:
            self._send(list(range(len(self.parts))), self.flat, "hvd_train.step")
        try:
            self._collect(len(self.sent))
        finally:
            # A wait that fails (a rank lost, under the elastic driver) must not leave its
            # handles to the step after the reset, which would wait on them again.
            self.sent = []
        if control_handle is not None:
            return hvd.synchronize(control_handle).numpy()
        return self._read_control(len(control))

    def _write_control(self, values: np.ndarray) -> None:
        if self.control.device.type == "cpu":
            self.control.numpy()[: len(values)] = values
        else:
            self.control[: len(values)] = torch.from_numpy(values)

    def _read_control(self, count: int) -> np.ndarray:
        if self.control.device.type == "cpu":
            return self.control.numpy()[:count].astype(np.float64)
        return self.control[:count].cpu().numpy().astype(np.float64)


class Stepping:
    """What a distributed optimizer's step does around the optimizer's own: the gradients
    averaged (`FlatExchange`), unscaled under fp16-mixed, their norm taken (where they are clipped,
    or `measured`) and clipped to `clip_norm` (0: not clipped), then the update, skipped alike
    on every rank where fp16's gradients overflowed. Sharded (`shards`), the optimizer updates
    this rank's pieces, from its part of the averages, and every rank's updated pieces then
    reach every rank. Where nothing needs all the averages before the update (no clipping, no
    fp16 loss scale) and an element-wise optimizer, each bucket's pieces are updated as soon as
    its averages arrive (`early`), during the backward pass, and are on their way to every rank
    while the pass goes on: where buckets leave within the pass, the optimizer's settings (its
    learning rate) must be set before it, which the step checks; a bucket that may hold a
    parameter no rank reached waits for the step, which skips such parameters (`unreached`).
    Inside `no_sync` (DDP's), the step updates with this rank's own gradients, averaging
    nothing, and skips what this rank did not reach."""

    def __init__(self, exchange: Bucketed, scaler: torch.amp.GradScaler | None,
                 clip_norm: float, shards: Any = None) -> None:  # fmt: skip
        self.exchange, self.scaler, self.clip_norm = exchange, scaler, clip_norm
        self.shards = shards
        self.early = shards is not None and scaler is None and not clip_norm and (
            shards.element_wise)  # fmt: skip
        self.optimizer_step: Callable[[], Any] | None = None  # its own step (`distribute`)
        # The optimizer's settings as the step's first bucket left in its backward pass.
        self.settings: list[dict[str, Any]] | None = None
        if self.early:
            exchange.leaving, exchange.landed = self._leaving, self._landed
        # Whether each step checks that the averaged gradients are finite (a recipe's step reports
        # it), taking their norm only where they are not, or are clipped, or sharded.
        self.measured = False
        self.norm: torch.Tensor | None = None  # of the last step's gradients, where it was taken
        self.inside = False  # in the optimizer's own step, called by GradScaler
        self.scaled = False  # whether the step's loss went through `backward`

    def _norm(self) -> torch.Tensor:
        """The averaged gradients' norm: sharded, each rank's part's, then their sum."""
        if self.shards is not None:
            return self.shards.norm()
        return squared_norm([self.exchange.gradients]).sqrt().to(self.exchange.dtype)

    def _leaving(self) -> None:
        """A bucket leaves in the backward pass: its update will take the settings of now."""
        if self.settings is None:
            self.settings = settings(self.shards.optimizer)

    def _landed(self, bucket: int) -> None:
        """`bucket`'s averages are in: its pieces updated at once (`early`), unless this rank
        left one of its parameters without a gradient, which no rank may have reached: then
        in the step, once the ranks agree (`update`)."""
        assert self.optimizer_step is not None, "distribute sets it"
        if not self.exchange.full(bucket):
            self.exchange.deferred.append(bucket)
            return
        self.shards.update(bucket, self.optimizer_step)

    @contextlib.contextmanager
    def _skipping(self, unreached: list[int]) -> Iterator[None]:
        """The `unreached` parameters (their pieces, sharded) without a .grad meanwhile: the
        optimizer's step skips them, as plain torch does (no weight decay, no momentum)."""
        shards = self.shards
        if shards is None:
            held = [self.exchange.parameters[index] for index in unreached]
        else:
            held = [shards.tensors[index] for index in unreached if index in shards.tensors]
        grads = [tensor.grad for tensor in held]
        for tensor in held:
            tensor.grad = None
        try:
            yield
        finally:
            for tensor, grad in zip(held, grads, strict=True):
                tensor.grad = grad

    def update(self, optimizer: torch.optim.Optimizer, own_step: Callable[[], Any]) -> None:
        if self.scaler is not None and not self.scaled:
            raise UsageError(
                "under fp16-mixed the loss is scaled before its backward pass: call "
                "dist.backward(loss) instead of loss.backward()"
            )
        shards, exchange = self.shards, self.exchange
        if not exchange.holding:
            exchange.synchronize()
            unreached = exchange.unreached
        elif shards is None:
            unreached = np.flatnonzero(~exchange.reached).tolist()
        else:
            raise UsageError(
                "optimizer.step() inside no_sync() updates with this rank's own gradients, and "
                "sharded, each rank holds its part of the state only: step outside no_sync()",
                every_rank=True,
            )
        if self.scaler is not None:
            self.scaler.unscale_(optimizer)
            if shards is not None:
                shards.agree_on_overflow(self.scaler, optimizer)
        norm = None
        # Finite gradients have a finite sum, one pass over them; their norm, a pass in slices,
        # only where it is needed (docs/performance.md, "A light step"). Sharded, every rank
        # takes its part's, and their sum makes the ranks agree.
        if self.clip_norm or (self.measured and shards is not None):
            norm = self._norm()
        elif self.measured and not self.exchange.gradients.sum().isfinite():
            norm = self._norm()  # what it became: the step reports it
        if self.clip_norm:
            assert norm is not None
            clipped = shards.tensors.values() if shards else self.exchange.parameters
            nn.utils.clip_grads_with_norm_(list(clipped), self.clip_norm, norm)
        self.inside = True
        changed = None
        try:
            with self._skipping(unreached):
                if self.early:  # every bucket updated as its averages arrived, or deferred
                    for bucket in exchange.deferred:
                        shards.update(bucket, own_step)
                    if self.settings is not None:  # some within the backward pass
                        changed = changed_setting(self.settings, settings(optimizer))
                elif self.scaler is None:
                    own_step()
                else:  # the same averaged gradients on every rank: all skip an overflow alike
                    self.scaler.step(optimizer)
                    self.scaler.update()
                    if norm is not None and not norm.isfinite():
                        norm = torch.zeros(())  # a skipped step, not a fault
        finally:
            self.inside = self.scaled = False
            self.settings = None
            exchange.stepped()
        if shards is not None:
            shards.gather()
        self.norm = norm
        if changed:
            raise UsageError(
                f"the optimizer's {changed} changed between the backward pass and step(); "
                "sharded, each rank updates its part of the parameters as their averages arrive "
                "in the backward pass, with the settings of that moment: set it before the "
                "backward pass (as a scheduler stepped after optimizer.step() does)",
                every_rank=True,
            )


class DistributedTorchOptimizer(torch.optim.Optimizer):
    """Mixed into the class of the optimizer `setup` takes (`distribute`): its `step` averages
    the gradients over the ranks before the optimizer's own, and `zero_grad` zeroes them where
    they are exchanged. The optimizer stays the same object, so a learning-rate scheduler made
    for it before goes on working."""

    _stepping: Stepping

    def zero_grad(self, set_to_none: bool = True) -> None:
        stepping = self._stepping
        if stepping.settings is not None:  # buckets left in the pass (sharded), no step
            raise UsageError(
                "optimizer.zero_grad() came between a backward pass and its step(); sharded, "
                "each rank updates its part of the parameters as their averages arrive in the "
                "backward pass, so that pass has begun the update: call optimizer.step() after "
                "each backward pass",
                every_rank=True,
            )
        stepping.exchange.clear()

    def step(self, closure: Any = None, **kwargs: Any) -> Any:
        stepping = self._stepping
        if stepping.inside:  # GradScaler.step, calling the optimizer's own
            return super().step(closure, **kwargs)
        if closure is not None:
            raise UsageError(
                "a distributed optimizer's step takes no closure (it would run the passes "
                "again after the gradients were averaged); call step() after the backward pass"
            )
        stepping.update(self, super().step)
        return None


def settings(optimizer: torch.optim.Optimizer) -> list[dict[str, Any]]:
    """Each group's settings (all but its parameters), as they are now."""
    return [{key: value.clone() if isinstance(value, torch.Tensor) else value
             for key, value in group.items() if key != "params"}
            for group in optimizer.param_groups]  # fmt: skip


def changed_setting(before: list[dict[str, Any]], now: list[dict[str, Any]]) -> str | None:
    """The name of a setting that differs between `before` and `now`, or None."""
    for old, new in zip(before, now, strict=True):
        for key in old.keys() | new.keys():
            a, b = old.get(key), new.get(key)
            tensors = isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor)
            if not (torch.equal(torch.as_tensor(a), torch.as_tensor(b)) if tensors else a == b):
                return key
    return None


def distribute(optimizer: torch.optim.Optimizer, stepping: Stepping) -> None:
    """Makes `optimizer` a `DistributedTorchOptimizer`, stepping as `stepping` says."""
    own = type(optimizer)
    stepping.optimizer_step = functools.partial(own.step, optimizer)
    distributed = type(own.__name__, (DistributedTorchOptimizer, own), {})
    optimizer.__class__ = distributed
    optimizer._stepping = stepping  # type: ignore[attr-defined]
    if "step" in vars(optimizer):
        # A learning-rate scheduler made before wrapped the optimizer's own step, to learn that
        # it was called: wrapped anew around the distributed step.
        def step(*args: Any, **kwargs: Any) -> Any:
            optimizer._opt_called = True  # type: ignore[attr-defined]
            return distributed.step(optimizer, *args, **kwargs)  # type: ignore[attr-defined]

        step._wrapped_by_lr_sched = True  # type: ignore[attr-defined]
        optimizer.step = step  # type: ignore[method-assign]
