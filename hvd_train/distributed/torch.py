"""PyTorch under Horovod.

The model is a `torch.nn.Module`: built from the neutral layer list, a recipe's own module, or a
Keras 3 model on Keras's torch backend (whose layers are torch modules too). Either way the
gradients of its trainable parameters live in one flat buffer, averaged over the ranks in place
by Horovod: whole after the step's backward passes, or in buckets while the last pass goes on
(`Exchange`).
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import io
import logging
import math
import os
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from types import MappingProxyType
from typing import Any

import horovod.torch as hvd
import numpy as np
import torch
import torch.nn.functional as F
from horovod.common.elastic import ObjectState
from torch import nn

from hvd_train.data.base import batch_size
from hvd_train.distributed.backend import (
    Adapter,
    Arrays,
    Batch,
    ElasticState,
    Exported,
    Loss,
    ModelState,
    OverlapChoice,
    StepResult,
    T,
    buckets,
    keep_freed_memory,
)
from hvd_train.errors import UsageError
from hvd_train.recipe.settings import (
    EPSILON,
    LOSS_SCALED,
    RMSPROP_DECAY,
    Horovod,
    Optimizer,
    function_name,
)

Inputs = torch.Tensor | dict[str, torch.Tensor]  # named inputs: a dict


def seed_dropout(seed: int) -> None:
    """Seeds the generators dropout draws from, before each batch. The same numbers as
    torch.manual_seed, which also visits every other accelerator backend: 0.24 ms a step on
    CPU against 2 us here, about 1% of mnist_cnn's step on one core."""
    torch.default_generator.manual_seed(seed)
    if torch.cuda.is_initialized():
        torch.cuda.manual_seed(seed)


def cross_entropy(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The mean over every example, and every position: logits (N, ..., C) for integer labels
    (N, ...), classes last as in Keras (torch's own takes them second)."""
    return F.cross_entropy(logits.flatten(0, -2), labels.flatten())


class TorchModule:
    """A torch module as the adapter drives it. Images arrive channels-last (N, H, W, C) and
    are handed to the module as torch's (N, C, H, W); under mixed precision it computes in
    `autocast`'s dtype, and its outputs come back as fp32 for the loss."""

    def __init__(self, module: nn.Module, autocast: torch.dtype | None) -> None:
        self.module, self.autocast = module, autocast
        module.train()  # every part in one mode, so that `forward` can read the module's own

    def served(self, mixed: bool) -> Served:
        """The module for export, under autocast as in training if `mixed`."""
        if mixed and self.autocast is not None:
            return MixedServed(self.module, channels_first=True, autocast=self.autocast)
        return Served(self.module, channels_first=True)

    def forward(self, x: Inputs, training: bool) -> torch.Tensor:
        """The module's outputs on `x`: a tensor, or named inputs as keyword arguments. The
        mode is set on the whole module when it changes, and autocast entered only to compute
        in lower precision: each visits every submodule or device."""
        if training is not self.module.training:
            self.module.train(training)
        device = next(iter(x.values())) if isinstance(x, dict) else x
        autocast = (
            contextlib.nullcontext()
            if self.autocast is None
            else torch.autocast(device.device.type, self.autocast)
        )
        with autocast:
            if isinstance(x, dict):
                output: torch.Tensor = self.module(**x)
            else:
                output = self.module(x.permute(0, 3, 1, 2) if x.dim() == 4 else x)
        return output.float()

    def reseed(self, seed: int) -> None:
        seed_dropout(seed)

    def trainable(self) -> list[tuple[str, torch.Tensor]]:
        return [(n, p) for n, p in self.module.named_parameters() if p.requires_grad]

    def layer_types(self) -> list[str]:
        """The type of the module holding each trainable parameter, in `trainable`'s order."""
        holder = {id(p): type(m).__name__ for m in self.module.modules()
                  for p in m.parameters(recurse=False)}  # fmt: skip
        return [holder[id(p)] for _, p in self.trainable()]

    def buffers(self) -> dict[str, torch.Tensor]:
        return dict(self.module.named_buffers())

    def state(self) -> dict[str, torch.Tensor]:
        return self.module.state_dict()

    def trained_names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.trainable())

    def weights(self) -> Arrays:
        state = self.module.state_dict()
        return {name: tensor.detach().cpu().numpy().copy() for name, tensor in state.items()}

    def load_weights(self, weights: Arrays) -> None:
        state = {name: torch.from_numpy(array) for name, array in weights.items()}
        self.module.load_state_dict(state, strict=True)


class Served(nn.Module):
    """The model as it is exported: it takes inputs as the data gives them (images
    channels-last, turned for a torch module as the adapter turns them) and returns fp32
    outputs. Plain enough for TorchScript to compile, where torch.export cannot capture the
    model."""

    def __init__(self, module: nn.Module, channels_first: bool) -> None:
        super().__init__()
        self.module, self.channels_first = module, channels_first

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.channels_first and x.dim() == 4:
            x = x.permute(0, 3, 1, 2)
        output: torch.Tensor = self.module(x)
        return output.float()


class MixedServed(Served):
    """The exported model computing in autocast's dtype, as it did in training."""

    def __init__(self, module: nn.Module, channels_first: bool, autocast: torch.dtype) -> None:
        super().__init__(module, channels_first)
        self.autocast = autocast

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.autocast(x.device.type, self.autocast):
            return super().forward(x)


class KerasOnTorch:
    """A Keras 3 model on Keras's torch backend: channels-last inputs, Keras's `training` flag
    and seed generators, and its weights in the "keras" layout."""

    def __init__(self, model: Any) -> None:
        from hvd_train.builders import keras_models  # Keras only for a Keras model: seconds

        self.keras_models = keras_models
        self.module = model
        self.seed_states = keras_models.seed_states(model)

    def served(self, mixed: bool) -> Served:
        return Served(self.module, channels_first=False)  # mixed or not: Keras's own policy

    def forward(self, x: Inputs, training: bool) -> torch.Tensor:
        output: torch.Tensor = self.module(x, training=training)  # named inputs: a dict
        return output.float()  # mixed precision: Keras's policy, set as the model was built

    def reseed(self, seed: int) -> None:
        seed_dropout(seed)
        for index, state in enumerate(self.seed_states):
            state.assign(np.array([seed, index], dtype=state.dtype))

    def trainable(self) -> list[tuple[str, torch.Tensor]]:
        return [(v.path, v.value) for v in self.module.trainable_variables]

    def layer_types(self) -> list[str]:
        return self.keras_models.layer_types(self.module)

    def buffers(self) -> dict[str, torch.Tensor]:
        return {v.path: v.value for v in self.module.non_trainable_weights}

    def state(self) -> dict[str, torch.Tensor]:
        return {v.path: v.value for v in self.module.weights}

    def trained_names(self) -> tuple[str, ...]:
        return self.keras_models.trained_names(self.module)

    def weights(self) -> Arrays:
        return self.keras_models.weights(self.module)

    def load_weights(self, weights: Arrays) -> None:
        self.keras_models.load_weights(self.module, weights)


class ElasticTorchState(ObjectState):
    """The model, the optimizer and the position, for Horovod's elastic driver.

    Horovod's own TorchState syncs an optimizer by broadcasting its state, and a worker whose
    optimizer has none yet (a fresh start, a worker that just joined) first makes one by taking
    a step with zero gradients. Under weight decay that step moves every weight, and after a
    join only the newcomer takes it: its replica differs from then on. Here rank 0's optimizer
    state is handed out as it is, even empty, and nothing steps.
    """

    def __init__(self, adapter: TorchAdapter) -> None:
        self.adapter = adapter
        super().__init__(bcast_object=hvd.broadcast_object, get_rank=hvd.rank,
                         epoch=0, samples=0, started=False)  # fmt: skip
        self.save()

    def save(self) -> None:
        self.model = {name: t.detach().clone() for name, t in self.adapter.net.state().items()}
        self.optimizer = self.adapter._optimizer_state()
        super().save()

    def restore(self) -> None:
        with torch.no_grad():
            for name, tensor in self.adapter.net.state().items():
                tensor.copy_(self.model[name])
        self.adapter._load_optimizer_state(self.optimizer)
        super().restore()

    def sync(self) -> None:
        self.adapter.broadcast_state(include_optimizer=True)
        super().sync()


# The dtype each `[horovod] compression` sends gradients as (None: as they are).
TRAVEL_DTYPES = {"none": None, "fp16": torch.float16, "bf16": torch.bfloat16}
# Room at the end of the gradients' buffer for a step's control values (its flags, with
# OverlapChoice's two times, and the loss), which then travel with the last bucket.
CONTROL_SLOTS = 16


def laid_out(values: torch.Tensor, parameter: torch.Tensor) -> torch.Tensor:
    """`values` (as many as `parameter` has) in its shape and memory layout (channels-last, for
    one), as autograd lays out a gradient for it: what DDP's bucket views do."""
    strides = torch.empty_like(parameter, device="meta").stride()  # dense layouts kept
    return values.as_strided(parameter.shape, strides)


class Exchange:
    """Averages the gradients over the ranks, and the control values (flags, loss) with them.

    The gradients live in one flat buffer: each parameter's `.grad` is a view of it, laid out in
    buckets (`buckets`, in the order the backward pass fills them), so a bucket is one slice and
    goes to Horovod as one tensor, averaged in place: no copy into Horovod's fusion buffer and
    back (docs/performance.md, "Gradients in place"). Compressed, a slice travels as its cast
    and comes back into the buffer. Without overlap: the whole buffer, after the backward
    passes. With it: each bucket sent from a hook as the last pass finishes its last gradient,
    so its transfer overlaps the rest of the pass, as DDP's buckets do; the bucket the pass
    finishes last goes after it. The control values travel at the buffer's end, after the last
    bucket, where the buffer travels as float32 or float64; otherwise (compressed, or a model in
    16 bits) as float64 in an allreduce of their own, as Horovod fuses only tensors of one dtype.
    A parameter this rank left without a gradient sends its zeros, as another rank may have one.
    """

    def __init__(
        self, parameters: list[torch.Tensor], travel: torch.dtype | None, device: torch.device
    ) -> None:
        self.parameters, self.travel = parameters, travel
        dtypes = sorted({str(p.dtype).removeprefix("torch.") for p in parameters})
        if len(dtypes) > 1:
            raise UsageError(
                f"the model trains parameters of several dtypes ({', '.join(dtypes)}), and their "
                "gradients share one buffer: give them one dtype (module.float())"
            )
        self.buckets = buckets([p.numel() * p.element_size() for p in parameters])
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
        self.clear()
        self.watching = self.sending = False  # in the last pass: its buckets counted (sent)
        self.waiting: list[int] = []  # per bucket: its gradients still to come in this pass
        self.first_full: float | None = None  # when the pass filled its first bucket
        self.sent: list[tuple[torch.Tensor, Any]] = []  # a part of `flat`, and its handle
        if len(self.buckets) > 1:
            for bucket, indices in enumerate(self.buckets[:-1]):
                for index in indices:
                    self.parameters[index].register_post_accumulate_grad_hook(
                        functools.partial(self._accumulated, bucket)
                    )

    def clear(self) -> None:
        """Zero gradients, in the buffer (where something else put a .grad of its own, the
        view goes back)."""
        self.flat.zero_()
        for parameter, view in zip(self.parameters, self.views, strict=True):
            if parameter.grad is not view:
                parameter.grad = view

    def watch(self, send: bool) -> None:
        """Counts the coming pass's gradients into buckets, and sends each full one if `send`."""
        self.watching, self.sending = len(self.buckets) > 1, send
        self.waiting = [len(indices) for indices in self.buckets]
        self.first_full = None

    def _accumulated(self, bucket: int, _: torch.Tensor) -> None:
        if self.watching:
            self.waiting[bucket] -= 1
            if self.waiting[bucket] == 0:
                self.first_full = self.first_full or time.perf_counter()
                if self.sending:
                    self._send(self.parts[bucket], f"hvd_train.step.{bucket}")

    def _send(self, part: torch.Tensor, name: str) -> None:
        sent = part if self.travel is None else part.to(self.travel)
        self.sent.append((part, hvd.allreduce_async_(sent, op=hvd.Average, name=name)))

    def average(self, control: torch.Tensor) -> torch.Tensor:
        """After the backward passes: sends what is not on its way yet (everything, without
        overlap), waits, and leaves the averages in .grad; returns the averaged control values."""
        control_handle = None
        if self.carries_control:
            assert len(control) <= CONTROL_SLOTS, "more control values than CONTROL_SLOTS"
            self.control[: len(control)] = control
        else:
            control_handle = hvd.allreduce_async_(control, op=hvd.Average, name="hvd_train.control")
        if self.sending:
            for bucket, part in enumerate(self.parts):
                if self.waiting[bucket] or bucket == len(self.parts) - 1:
                    self._send(part, f"hvd_train.step.{bucket}")
        else:
            self._send(self.flat, "hvd_train.step")
        self.watching = self.sending = False
        # Taken before waiting: a wait that fails (a rank lost, under the elastic driver) must
        # not leave its handles to the step after the reset, which would wait on them again.
        sent, self.sent = self.sent, []
        for part, handle in sent:
            average = hvd.synchronize(handle)
            if self.travel is not None:
                part.copy_(average)
        if control_handle is None:
            return self.control[: len(control)].clone()
        return hvd.synchronize(control_handle)


class TorchAdapter(Adapter):
    name = "torch"
    hvd = hvd
    losses = MappingProxyType({"cross_entropy": cross_entropy})

    def init(self, may_overlap: bool = True) -> None:
        self.apply_horovod_defaults()
        keep_freed_memory()
        hvd.init()
        self._pin()

    def _pin(self) -> None:
        self.rank, self.local_rank = hvd.rank(), hvd.local_rank()
        self.world_size, self.local_size = hvd.size(), hvd.local_size()
        # Alone, Horovod registers no hooks (unless elastic) and would average each gradient by
        # itself, in a round trip to its background thread: there is nothing to exchange.
        self.exchanges = self.world_size > 1 or os.environ.get("HOROVOD_ELASTIC") == "1"
        if torch.cuda.is_available():
            torch.cuda.set_device(self.local_rank)
            self.device = torch.device("cuda", self.local_rank)
        else:
            torch.set_num_threads(self.threads_per_rank())
            self.device = torch.device("cpu")

    def setup(
        self, model: Any, optimizer: Optimizer, loss: Loss, horovod: Horovod, precision: str
    ) -> None:
        keras = sys.modules.get("keras")
        self.net: TorchModule | KerasOnTorch
        if keras is not None and isinstance(model, keras.Model):
            self.net = KerasOnTorch(model)
        else:
            self.net = TorchModule(model.to(self.device), AUTOCAST[precision])
        scaled = precision == LOSS_SCALED
        self.scaler = torch.amp.GradScaler(self.device.type) if scaled else None
        self.loss = self.resolved_loss(loss)
        self.clip_norm = optimizer.gradient_clip_norm
        trainable = self.net.trainable()
        parameters = [p for _, p in trainable]
        self.exchange = Exchange(parameters, TRAVEL_DTYPES[horovod.compression], self.device)
        self.overlap_choice = OverlapChoice(horovod.overlap, len(self.exchange.buckets))
        if optimizer.function is None:
            names = [name for name, _ in trainable]
            decays = self.decayed(optimizer, names, self.net.layer_types())
            self.optimizer = _optimizer(optimizer, parameters, decays)
        else:
            self.optimizer = _own_optimizer(optimizer.function, self.net, parameters)
        # Each group's rate over the first's: the schedule's rate times it, every step.
        rates = [group["lr"] for group in self.optimizer.param_groups]
        self.learning_rate = float(rates[0])
        self.rate_ratios = [rate / self.learning_rate for rate in rates]
        # The optimizer's state is saved by the parameter's place in `trainable`: `placed` maps
        # the optimizer's own order (its groups, one after the other) onto those places.
        positions = {id(p): index for index, p in enumerate(parameters)}
        self.placed = [positions[id(p)] for g in self.optimizer.param_groups for p in g["params"]]

    def broadcast_state(self, include_optimizer: bool) -> None:
        if include_optimizer:
            self._broadcast_optimizer_state()
        hvd.broadcast_parameters(self.net.state(), root_rank=0)

    def _broadcast_optimizer_state(self) -> None:
        """Rank 0's optimizer state, exactly, even empty: its layout first (names, shapes), then
        its tensors in place. Horovod's broadcast_optimizer_state instead makes state on ranks
        that have none by taking a step with zero gradients, which moves weights under weight
        decay (see ElasticTorchState)."""
        state = self._optimizer_state()
        layout = self.broadcast_object({n: (a.shape, a.dtype.str) for n, a in state.items()})
        if not self.is_rank_zero:
            self._load_optimizer_state({n: np.zeros(s, d) for n, (s, d) in layout.items()})
        parameters = [p for group in self.optimizer.param_groups for p in group["params"]]
        tensors = {
            f"{index}.{key}": value
            for index, parameter in enumerate(parameters)
            for key, value in self.optimizer.state.get(parameter, {}).items()
        }
        hvd.broadcast_parameters(tensors, root_rank=0)
        if self.scaler is not None:
            self.scaler.load_state_dict(self.broadcast_object(self.scaler.state_dict()))

    def sync_buffers(self) -> None:
        hvd.broadcast_parameters(self.net.buffers(), root_rank=0)

    def _tensors(self, x: Any, y: Any) -> tuple[Inputs, Any]:
        """A batch on the device; named inputs stay a dict, several targets a tuple."""
        labels = tuple(map(self._tensor, y)) if isinstance(y, tuple) else self._tensor(y)
        return self._inputs(x), labels

    def _inputs(self, x: Any) -> Inputs:
        if isinstance(x, dict):
            return {name: self._tensor(value) for name, value in x.items()}
        return self._tensor(x)

    def _tensor(self, array: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(array).to(self.device)

    def step(
        self, batches: list[Batch], learning_rate: float, seed: int, flags: np.ndarray,
        overlap: bool,
    ) -> StepResult:  # fmt: skip
        started = time.perf_counter()
        losses = []
        for index, (x, y) in enumerate(batches):
            self.net.reseed(seed + index)
            inputs, labels = self._tensors(x, y)
            loss = self.loss(self.net.forward(inputs, training=True), labels)
            if index == len(batches) - 1:  # the last pass sends buckets as they fill
                self.exchange.watch(send=overlap and self.exchanges)
            scaled = loss if self.scaler is None else self.scaler.scale(loss)
            # The batches' gradients add up in .grad, to their mean. (One batch: no division,
            # whose op and its backward would add to every step's fixed costs.)
            (scaled if len(batches) == 1 else scaled / len(batches)).backward()
            losses.append(loss.detach())
        mean = losses[0] if len(losses) == 1 else torch.stack(losses).mean()
        control = torch.from_numpy(np.append(np.asarray(flags, np.float64), float(mean)))
        computed = time.perf_counter()
        if self.exchanges:
            control = self.exchange.average(control)
        synced = time.perf_counter()
        norm = self._update(learning_rate)
        hide = computed - (self.exchange.first_full or computed)
        values = control.cpu().numpy()
        return StepResult(float(values[-1]), float(norm), values[:-1] * self.world_size,
                          computed - started, synced - computed, hide)  # fmt: skip

    def _update(self, learning_rate: float) -> torch.Tensor:
        """Applies the averaged gradients (clipped, and unscaled under fp16-mixed); returns
        their norm before clipping."""
        for group, ratio in zip(self.optimizer.param_groups, self.rate_ratios, strict=True):
            group["lr"] = learning_rate * ratio
        parameters = self.exchange.parameters
        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)
        norm = torch.linalg.vector_norm(self.exchange.gradients)  # every .grad: one reduction
        if self.clip_norm:
            nn.utils.clip_grads_with_norm_(parameters, self.clip_norm, norm)
        if self.scaler is None:
            self.optimizer.step()
        else:  # the same averaged gradients on every rank: all skip an overflow alike
            self.scaler.step(self.optimizer)
            self.scaler.update()
            norm = norm if norm.isfinite() else torch.zeros(())  # a skipped step, not a fault
        self.exchange.clear()
        return norm

    def local_step(self, batches: list[Batch], seed: int) -> None:
        parameters = [p for _, p in self.net.trainable()]
        totals: list[torch.Tensor] = [torch.zeros_like(p) for p in parameters]
        for index, (x, y) in enumerate(batches):
            self.net.reseed(seed + index)
            inputs, labels = self._tensors(x, y)
            loss = self.loss(self.net.forward(inputs, training=True), labels) / len(batches)
            gradients = torch.autograd.grad(loss, parameters, allow_unused=True)
            totals = [t if g is None else t + g for t, g in zip(totals, gradients, strict=True)]
        for parameter, total in zip(parameters, totals, strict=True):
            parameter.grad = total
        self.optimizer.step()
        self.exchange.clear()

    def gradient_allreduce(self) -> Callable[[], Any]:
        flat = torch.zeros_like(self.exchange.flat, dtype=self.exchange.travel)
        return lambda: hvd.allreduce_(flat, op=hvd.Average, name="hvd_train.bench")

    @torch.no_grad()
    def eval_batch(self, x: Any, y: Any = None) -> tuple[float, np.ndarray]:
        outputs = self.net.forward(self._inputs(x), training=False)
        if y is None:
            return math.nan, outputs.cpu().numpy()
        loss = self.loss(outputs, self._tensors(x, y)[1])
        return float(loss) * batch_size(x), outputs.cpu().numpy()

    def export(self, path: Path, format: str, example: np.ndarray) -> Exported:
        inputs = (self._tensor(example),)
        batch = {0: torch.export.Dim("batch", min=1)}  # any batch size
        if format == "onnx":  # in fp32: ONNX Runtime lacks bf16 kernels (its CPU convolution)
            served = self.net.served(mixed=False).eval()
            return path, _outputs(served, inputs), export_onnx(served, inputs, batch, path)
        served = self.net.served(mixed=True).eval()
        try:
            with _quiet_torch_export():
                program = torch.export.export(served, inputs, dynamic_shapes=(batch,))
        except Exception as error:  # torch.export's failures have many types
            # TorchScript cannot compile autocast on a device read from the input: fp32.
            served = self.net.served(mixed=False).eval()
            path = path.with_suffix(".pt")
            return path, _outputs(served, inputs), export_torchscript(served, inputs, path, error)
        torch.export.save(program, path)
        reloaded = torch.export.load(path).module()
        return path, _outputs(served, inputs), reloaded(*inputs).detach().cpu().numpy()

    def run_elastic(self, loop: Callable[[ElasticState], T]) -> T:
        state = ElasticTorchState(self)
        # The world changed: a new rank, a new share of the cores, and overlap decided anew.
        state.register_reset_callbacks([self._pin, self.overlap_choice.restart])
        return hvd.elastic.run(loop)(state)

    def state(self) -> ModelState:
        return ModelState(self.net.weights(), self.net.trained_names(), self._optimizer_state())

    def load_state(self, weights: Arrays | None = None, optimizer: Arrays | None = None) -> None:
        if weights is not None:
            self.net.load_weights(weights)
        if optimizer is not None:
            self._load_optimizer_state(optimizer)

    def _optimizer_state(self) -> Arrays:
        """Each parameter's state tensors, keyed `<param index>.<name>` (`0.exp_avg`, ...),
        and under fp16-mixed the loss scale and its count of steps since it last changed."""
        state = self.optimizer.state_dict()["state"]
        arrays = {
            f"{self.placed[index]}.{key}": torch.as_tensor(value).detach().cpu().numpy().copy()
            for index, entries in state.items()
            for key, value in entries.items()
        }
        if self.scaler is not None:
            scaler = self.scaler.state_dict()
            arrays |= {f"scaler.{key}": np.array(scaler[key]) for key in SCALER_STATE}
        return arrays

    def _load_optimizer_state(self, state: Arrays) -> None:
        """Restores `state`, which must hold state for every parameter, shaped like it."""
        if self.scaler is not None and "scaler.scale" in state:
            scaler = {key: state[f"scaler.{key}"].item() for key in SCALER_STATE}
            self.scaler.load_state_dict(self.scaler.state_dict() | scaler)
        entries: dict[int, dict[str, torch.Tensor]] = {}
        for name, array in state.items():
            if name.startswith("scaler."):
                continue
            position, key = name.split(".", 1)
            entries.setdefault(int(position), {})[key] = torch.from_numpy(array)
        shapes = [tuple(p.shape) for _, p in self.net.trainable()]
        if entries and sorted(entries) != list(range(len(shapes))):
            raise ValueError(f"state for {len(entries)} parameters, the model has {len(shapes)}")
        for index, values in entries.items():
            for key, tensor in values.items():  # per-parameter tensors, and scalars ("step")
                if tensor.dim() and tuple(tensor.shape) != shapes[index]:
                    raise ValueError(f"{index}.{key} is {tuple(tensor.shape)}, not {shapes[index]}")
        current = self.optimizer.state_dict()
        ordered = {at: entries[index] for at, index in enumerate(self.placed) if index in entries}
        self.optimizer.load_state_dict({"state": ordered, "param_groups": current["param_groups"]})


@torch.no_grad()
def _outputs(served: nn.Module, inputs: tuple[torch.Tensor]) -> np.ndarray:
    return served(*inputs).cpu().numpy()


@contextlib.contextmanager
def _quiet_torch_export() -> Iterator[None]:
    """torch.export's own account of what it cannot capture (logged warnings and the graphs
    it printed) kept off the terminal: one line says it, and TorchScript takes over."""
    torch_logs = logging.getLogger("torch")
    level = torch_logs.level
    torch_logs.setLevel(logging.CRITICAL)
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            yield
    finally:
        torch_logs.setLevel(level)


def export_torchscript(
    served: Served, inputs: tuple[torch.Tensor], path: Path, error: Exception
) -> np.ndarray:
    """Where torch.export cannot capture the model (a Python branch on a tensor's value, most
    often), TorchScript compiles its code, branches included."""
    print(f"hvd-train: torch.export cannot capture this model ({type(error).__name__}); "
          f"compiling it with TorchScript into {path}", file=sys.stderr)  # fmt: skip
    try:
        with warnings.catch_warnings(action="ignore"):  # TorchScript's deprecation notice
            scripted = torch.jit.script(served)
    except Exception as script_error:  # TorchScript's failures have many types too
        raise UsageError(
            f"neither torch.export ({type(error).__name__}: {str(error).splitlines()[0]}) nor "
            f"TorchScript ({type(script_error).__name__}) can take this model; export a "
            "Keras model as keras or savedmodel, or rewrite the branch on a tensor's value "
            "with torch.cond"
        ) from None
    torch.jit.save(scripted, str(path))
    return torch.jit.load(str(path))(*inputs).detach().cpu().numpy()


def export_onnx(
    served: nn.Module, inputs: tuple[torch.Tensor], batch: dict[int, Any], path: Path
) -> np.ndarray | None:
    """`served` as an ONNX graph, by torch's exporter (which needs onnx and onnxscript); its
    outputs from ONNX Runtime, where that is installed."""
    for needed in ("onnx", "onnxscript"):
        if importlib.util.find_spec(needed) is None:
            raise UsageError(
                f"--format onnx needs {needed}, which is not installed; pip install "
                "'hvd_train[onnx]'"
            )
    logging.getLogger("torch.onnx").setLevel(logging.ERROR)  # notes on torchvision's absence
    with warnings.catch_warnings(action="ignore"):  # and on what the exporter rewrites
        program = torch.onnx.export(served, inputs, dynamo=True, dynamic_shapes=(batch,),
                                    verbose=False)  # fmt: skip
    assert program is not None, "the dynamo exporter returns its program"
    program.save(str(path))
    if importlib.util.find_spec("onnxruntime") is None:
        return None
    import onnxruntime

    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    return np.asarray(session.run(None, {name: inputs[0].cpu().numpy()})[0])


SCALER_STATE = ("scale", "_growth_tracker")  # what GradScaler's state_dict holds that changes
AUTOCAST = {"fp32": None, "bf16-mixed": torch.bfloat16, "fp16-mixed": torch.float16}


def _own_optimizer(
    function: Callable[..., Any], net: TorchModule | KerasOnTorch, parameters: list[torch.Tensor]
) -> torch.optim.Optimizer:
    """The optimizer a Python recipe's `optimizer.function` makes for its torch module,
    checked: a torch optimizer over every trainable parameter, each once, at a positive rate."""
    name = function_name(function)
    if not isinstance(net, TorchModule):
        raise UsageError(
            f"optimizer.function ({name}) makes a torch optimizer for a torch module, and this "
            "recipe trains a Keras model under torch; train it under --framework tensorflow, or "
            "give it an Optimizer(...) table"
        )
    made = function(net.module)
    if not isinstance(made, torch.optim.Optimizer):
        raise UsageError(
            f"optimizer.function ({name}) returned {type(made).__name__}; under torch it must "
            "return a torch.optim.Optimizer over the module's parameters"
        )
    held = [id(p) for group in made.param_groups for p in group["params"]]
    if sorted(held) != sorted(id(p) for p in parameters):
        raise UsageError(
            f"optimizer.function ({name}): its parameter groups hold {len(held)} tensors "
            f"({len(set(held) & {id(p) for p in parameters})} of the model's trainable ones), "
            f"and the module has {len(parameters)} trainable parameters; give each of them to "
            "one group, once"
        )
    if not all(group["lr"] > 0 for group in made.param_groups):
        raise UsageError(f"optimizer.function ({name}): every group needs a learning rate above 0")
    return made


def _optimizer(
    config: Optimizer, parameters: list[torch.Tensor], decays: list[bool]
) -> torch.optim.Optimizer:
    """The recipe's optimizer in its fused form: one kernel updates every parameter (on CPU
    too), where torch's default runs several ops per parameter group. Adam's update of
    mnist_cnn on one core: 0.20 ms fused, 0.65 ms by default. The parameters that
    `weight_decay_exclude` names form a second group, without weight decay."""
    lr, decay = config.learning_rate, config.weight_decay
    decayed = [p for p, d in zip(parameters, decays, strict=True) if d]
    kept = [p for p, d in zip(parameters, decays, strict=True) if not d]
    groups: list[dict[str, Any]] = [{"params": decayed}] if decayed else []
    groups += [{"params": kept, "weight_decay": 0.0}] if kept else []
    if config.name == "sgd":
        return torch.optim.SGD(groups, lr=lr, momentum=config.momentum, nesterov=config.nesterov,
                               weight_decay=decay, fused=True)  # fmt: skip
    if config.name == "rmsprop":  # (no fused form)
        return torch.optim.RMSprop(groups, lr=lr, alpha=RMSPROP_DECAY, eps=EPSILON,
                                   momentum=config.momentum, weight_decay=decay,
                                   foreach=True)  # fmt: skip
    kind = torch.optim.Adam if config.name == "adam" else torch.optim.AdamW
    return kind(groups, lr=lr, eps=EPSILON, weight_decay=decay, fused=True)
