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


def laid_out(values: torch.Tensor, parameter: torch.Tensor) -> torch.Tensor:
    """`values` (as many as `parameter` has) in its shape and memory layout (channels-last, for
    one), as autograd lays out a gradient for it: what DDP's bucket views do."""
    strides = torch.empty_like(parameter, device="meta").stride()  # dense layouts kept
    return values.as_strided(parameter.shape, strides)


class Exchange:
    """Averages the gradients over the ranks, and a step's control values with them.

    A bucket leaves from its hook once its gradients have all arrived in the step's last
    backward pass: the `passes`-th, counting each gradient's arrival outside `no_sync`. One
    that never fills (a parameter without a gradient in a pass) leaves when the optimizer
    steps. A parameter this rank left without a gradient sends zeros, as another rank may have
    one. The control values travel in slots at the buffer's end where the buffer travels as
    float32 or float64; otherwise (compressed, or a model in 16 bits) as float64 in an
    allreduce of their own, as Horovod fuses only tensors of one dtype. Alone (one rank, not
    elastic), nothing travels.
    """

    def __init__(self, parameters: list[torch.Tensor], travel: torch.dtype | None,
                 device: torch.device, passes: int, overlap: bool | str,
                 exchanges: bool) -> None:  # fmt: skip
        self.parameters, self.travel, self.passes = parameters, travel, passes
        self.exchanges = exchanges
        dtypes = sorted({str(p.dtype).removeprefix("torch.") for p in parameters})
        if len(dtypes) > 1:
            raise UsageError(
                f"the model trains parameters of several dtypes ({', '.join(dtypes)}), and their "
                "gradients share one buffer: give them one dtype (module.float())"
            )
        self.buckets = buckets([p.numel() * p.element_size() for p in parameters])
        self.choice = OverlapChoice(overlap, len(self.buckets))
        dtype = parameters[0].dtype if parameters else torch.float32
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
        self.holding = False  # in no_sync: gradients arrive without counting
        self.sent: list[tuple[torch.Tensor, Any]] = []  # a part of `flat`, and its handle
        self.clear()
        self.stepped()
        if len(self.buckets) > 1:
            for bucket, indices in enumerate(self.buckets):
                for index in indices:
                    self.parameters[index].register_post_accumulate_grad_hook(
                        functools.partial(self._accumulated, bucket, index)
                    )

    def clear(self) -> None:
        """Zero gradients, in the buffer; the time the step's passes begin."""
        self.flat.zero_()
        for parameter, view in zip(self.parameters, self.views, strict=True):
            if parameter.grad is not view:
                parameter.grad = view
        self.began = time.perf_counter()

    def stepped(self) -> None:
        """The step is over: the next one counts its gradients' arrivals anew."""
        self.arrived = [0] * len(self.buckets)  # per bucket: its gradients in the step
        self.first_full: float | None = None  # when the last pass filled its first bucket
        self.averaged: np.ndarray | None = None  # the step's control values, once averaged

    def _accumulated(self, bucket: int, index: int, parameter: torch.Tensor) -> None:
        """A gradient arrived: one the loop set aside (a .grad set to None, as
        `module.zero_grad()` does) comes back into the buffer, and a bucket whose gradients
        have all arrived in the step's last pass leaves."""
        view, grad = self.views[index], parameter.grad
        if grad is not view and grad is not None:
            view.copy_(grad)
            parameter.grad = view
        if self.holding:
            return
        self.arrived[bucket] += 1
        if self.arrived[bucket] == len(self.buckets[bucket]) * self.passes:
            self.first_full = self.first_full or time.perf_counter()
            last = bucket == len(self.buckets) - 1  # sent last, with the control values
            if self.choice.overlap and self.exchanges and not last:
                self._send(self.parts[bucket], f"hvd_train.step.{bucket}")

    def _send(self, part: torch.Tensor, name: str) -> None:
        sent = part if self.travel is None else part.to(self.travel)
        self.sent.append((part, hvd.allreduce_async_(sent, op=hvd.Average, name=name)))

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

    def synchronize(self, carry: np.ndarray | None = None) -> np.ndarray:
        """Once per step, after its backward passes: sends what is not on its way yet, waits,
        and leaves the averages in .grad; `carry` travels with them, and while "auto" decides,
        the step's times. Returns the averaged `carry` (again, when called again in the same
        step)."""
        if self.averaged is not None:
            return self.averaged
        started = time.perf_counter()
        self._claim()
        deciding = self.choice.deciding
        values = np.zeros(0) if carry is None else carry
        if deciding:
            values = np.concatenate([values, self.choice.last])
        averaged = self._average(values) if self.exchanges else values
        if deciding:
            self.choice.record(started - self.began, time.perf_counter() - started, averaged[-2:])
            averaged = averaged[:-2]
        self.averaged = averaged
        return averaged

    def _average(self, control: np.ndarray) -> np.ndarray:
        """Averages the gradients, and `control` with them (nothing more where it is empty):
        in the buffer's slots, written and read as NumPy on the CPU (no torch op to dispatch),
        else in an allreduce of their own."""
        control_handle = None
        if not len(control):
            pass
        elif self.carries_control:
            assert len(control) <= CONTROL_SLOTS, "more control values than CONTROL_SLOTS"
            self._write_control(control)
        else:
            control_handle = hvd.allreduce_async_(torch.from_numpy(control), op=hvd.Average,
                                                  name="hvd_train.control")  # fmt: skip
        if self.choice.overlap:
            full = [count == len(b) * self.passes for count, b in zip(self.arrived, self.buckets,
                                                                        strict=True)]  # fmt: skip
            for bucket, part in enumerate(self.parts):
                if not full[bucket] or bucket == len(self.parts) - 1:
                    self._send(part, f"hvd_train.step.{bucket}")
        else:
            self._send(self.flat, "hvd_train.step")
        # Taken before waiting: a wait that fails (a rank lost, under the elastic driver) must
        # not leave its handles to the step after the reset, which would wait on them again.
        sent, self.sent = self.sent, []
        for part, handle in sent:
            average = hvd.synchronize(handle)
            if self.travel is not None:
                part.copy_(average)
        if not len(control):
            return control
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
    averaged (`Exchange`), unscaled under fp16-mixed, their norm taken (where they are clipped,
    or `measured`) and clipped to `clip_norm` (0: not clipped), then the update, skipped alike
    on every rank where fp16's gradients overflowed."""

    def __init__(self, exchange: Exchange, scaler: torch.amp.GradScaler | None,
                 clip_norm: float) -> None:  # fmt: skip
        self.exchange, self.scaler, self.clip_norm = exchange, scaler, clip_norm
        self.measured = False  # whether each step takes the norm (a recipe's step reports it)
        self.norm = torch.zeros(())  # of the last step's averaged gradients, before clipping
        self.inside = False  # in the optimizer's own step, called by GradScaler
        self.scaled = False  # whether the step's loss went through `backward`

    @contextlib.contextmanager
    def own_step(self) -> Iterator[None]:
        """The optimizer's own step meanwhile, with nothing averaged (bench's local step)."""
        self.inside = True
        try:
            yield
        finally:
            self.inside = False

    def update(self, optimizer: torch.optim.Optimizer, own_step: Callable[[], Any]) -> None:
        if self.scaler is not None and not self.scaled:
            raise UsageError(
                "under fp16-mixed the loss is scaled before its backward pass: call "
                "dist.backward(loss) instead of loss.backward()"
            )
        self.exchange.synchronize()
        if self.scaler is not None:
            self.scaler.unscale_(optimizer)
        norm = self.norm
        if self.clip_norm or self.measured:
            norm = torch.linalg.vector_norm(self.exchange.gradients)  # every .grad: one reduction
        if self.clip_norm:
            nn.utils.clip_grads_with_norm_(self.exchange.parameters, self.clip_norm, norm)
        self.inside = True
        try:
            if self.scaler is None:
                own_step()
            else:  # the same averaged gradients on every rank: all skip an overflow alike
                self.scaler.step(optimizer)
                self.scaler.update()
                norm = norm if norm.isfinite() else torch.zeros(())  # a skipped step, no fault
        finally:
            self.inside = self.scaled = False
            self.exchange.stepped()
        self.norm = norm


class DistributedOptimizer(torch.optim.Optimizer):
    """Mixed into the class of the optimizer `setup` takes (`distribute`): its `step` averages
    the gradients over the ranks before the optimizer's own, and `zero_grad` zeroes them where
    they are exchanged. The optimizer stays the same object, so a learning-rate scheduler made
    for it before goes on working."""

    _stepping: Stepping

    def zero_grad(self, set_to_none: bool = True) -> None:
        self._stepping.exchange.clear()

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


def distribute(optimizer: torch.optim.Optimizer, stepping: Stepping) -> None:
    """Makes `optimizer` a `DistributedOptimizer`, stepping as `stepping` says."""
    own = type(optimizer)
    distributed = type(own.__name__, (DistributedOptimizer, own), {})
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
