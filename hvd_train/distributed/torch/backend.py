"""PyTorch under Horovod: the torch backend of the distributed layer.

The model is a `torch.nn.Module` (a loop's own, one built from the neutral layer list, a
recipe's), or a Keras 3 model on Keras's torch backend; `modules.py` drives either. The
optimizer becomes distributed (`exchange.py`): its step averages the gradients, which live in
one flat buffer that Horovod averages in place. `optimizers.py` makes a recipe's optimizer and
keeps optimizer state as arrays; `export.py` writes the model for serving; `elastic.py` is the
state Horovod's elastic driver restores.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import MappingProxyType
from typing import Any

import horovod.torch as hvd
import numpy as np
import torch
from torch import nn

from hvd_train.data.base import batch_size
from hvd_train.distributed.backend import (
    Backend,
    Batch,
    ElasticState,
    Exported,
    Loss,
    ModelState,
    StepResult,
    T,
)
from hvd_train.distributed.checkpoint_files import Arrays
from hvd_train.distributed.host import start_horovod, threads_per_rank
from hvd_train.distributed.torch import exchange as gradients
from hvd_train.distributed.torch import sharding
from hvd_train.distributed.torch.modules import (
    AUTOCAST,
    Inputs,
    KerasOnTorch,
    Net,
    TorchModule,
    compute_in,
    cross_entropy,
    seed_dropout,
)
from hvd_train.distributed.torch.optimizers import OptimizerState, made_optimizer
from hvd_train.errors import UsageError
from hvd_train.recipe.settings import LOSS_SCALED, ExchangeSettings


class TorchBackend(Backend):
    name = "torch"
    hvd = hvd
    losses = MappingProxyType({"cross_entropy": cross_entropy})

    def start(self, precision: str | None, may_overlap: bool) -> None:
        start_horovod(hvd)
        self._pin()

    def _pin(self) -> None:
        self.take_place()
        # Alone, Horovod registers no hooks (unless elastic) and would average each gradient by
        # itself, in a round trip to its background thread: there is nothing to exchange.
        self.exchanges = self.world_size > 1 or os.environ.get("HOROVOD_ELASTIC") == "1"
        if torch.cuda.is_available():
            torch.cuda.set_device(self.local_rank)
            self.device = torch.device("cuda", self.local_rank)
        else:
            torch.set_num_threads(threads_per_rank(self.local_size))
            self.device = torch.device("cpu")

    def setup(self, model: Any, optimizer: Any, settings: ExchangeSettings, clip_norm: float,
              loss: Loss, precision: str = "fp32") -> tuple[Any, Any]:  # fmt: skip
        self.net = self._net(model, precision)
        scaled = precision == LOSS_SCALED
        self.scaler = torch.amp.GradScaler(self.device.type) if scaled else None
        self.loss = self.resolved_loss(loss)
        parameters = [p for _, p in self.net.trainable()]
        self.optimizer = made_optimizer(optimizer, self.net, parameters)
        # Each group's rate over the first's: a schedule's rate times it, every step.
        rates = [group["lr"] for group in self.optimizer.param_groups]
        self.learning_rate = float(rates[0])
        self.rate_ratios = [rate / self.learning_rate for rate in rates]
        self.optimizer_state: OptimizerState | sharding.ShardedState = OptimizerState(
            self.optimizer, parameters, self.scaler
        )
        travel = gradients.TRAVEL_DTYPES[settings.compression]
        passes, overlap = settings.backward_passes_per_step, settings.overlap
        if settings.shard != "none" and os.environ.get("HOROVOD_ELASTIC") == "1":
            raise UsageError(
                f'[horovod] shard = "{settings.shard}" does not train under horovodrun\'s elastic '
                "mode yet (a rank that leaves would take its part of the state with it); set "
                'shard = "none" there, or launch without elastic options',
                every_rank=True,
            )
        self.sharded = settings.shard != "none" and self.world_size > 1
        shards = None
        self.exchange: gradients.Bucketed
        if not self.sharded:
            self.exchange = gradients.FlatExchange(parameters, travel, self.device, passes, overlap,
                                               self.exchanges)  # fmt: skip
        else:
            shards = self._shard(parameters, settings.shard, travel, passes, overlap)
        self.stepping = gradients.Stepping(self.exchange, self.scaler, clip_norm,
                                           shards)  # fmt: skip
        gradients.distribute(self.optimizer, self.stepping)
        return self.net.module, self.optimizer

    def _shard(self, parameters: list[torch.Tensor], shard: str, travel: torch.dtype | None,
               passes: int, overlap: bool | str) -> sharding.TorchShards:  # fmt: skip
        """This rank's part of the optimizer's state (and of the averaged gradients, with
        shard = "gradients"): the optimizer's groups hold its pieces from now on."""
        ids = {id(p) for p in parameters}
        for name, value in vars(self.optimizer).items():
            listed = isinstance(value, list | tuple) and name != "param_groups"
            if listed and any(id(item) in ids for item in value):
                raise UsageError(
                    f'setup: shard = "{shard}" gives each rank its part of the parameters through '
                    f"the optimizer's groups, and {type(self.optimizer).__name__} keeps them in "
                    f".{name} beside its groups, for steps over all of them; choose another "
                    'optimizer, or set shard = "none"'
                )
        # A whole state the optimizer brought (loaded before setup), handed out from rank 0.
        whole_state = self.optimizer_state
        assert isinstance(whole_state, OptimizerState)
        brought = whole_state.arrays() if self.optimizer.state else None
        whole = type(self.optimizer) not in sharding.ELEMENT_WISE
        if shard == "gradients":
            scattering = sharding.ScatteringExchange(
                parameters, self.world_size, self.rank, whole, travel, self.device, passes,
                overlap, self.exchanges,
            )  # fmt: skip
            self.exchange, partition = scattering, scattering.partition
            gradient = scattering.gradient
        else:
            exchange = gradients.FlatExchange(parameters, travel, self.device, passes, overlap,
                                          self.exchanges)  # fmt: skip
            self.exchange = exchange
            partition = sharding.partition(parameters, exchange.buckets, self.world_size, whole)
            gradient = functools.partial(sharding.flat_gradient, exchange.gradients, partition,
                                         self.rank)  # fmt: skip
        shards = sharding.TorchShards(parameters, partition, self.rank, self.optimizer, gradient)
        self.optimizer_state = sharding.ShardedState(self.optimizer, shards, whole_state)
        self.optimizer_state.pending = brought
        return shards

    def _net(self, model: Any, precision: str) -> Net:
        keras = sys.modules.get("keras")
        if keras is not None and isinstance(model, keras.Model):
            return KerasOnTorch(model)  # its precision: Keras's policy, set as it was built
        if not isinstance(model, nn.Module):
            raise UsageError(
                f"setup: the model is a {type(model).__module__}.{type(model).__name__}, and this "
                "job runs torch; give a torch.nn.Module (or a Keras model on Keras's torch "
                "backend)"
            )
        model.to(self.device)
        autocast = AUTOCAST[precision]
        if autocast is not None:
            compute_in(model, autocast, self.device)
        return TorchModule(model)

    def broadcast_state(self, include_optimizer: bool) -> None:
        if include_optimizer:
            self.optimizer_state.broadcast()
        hvd.broadcast_parameters(self.net.state(), root_rank=0)

    def sync_buffers(self) -> None:
        hvd.broadcast_parameters(self.net.buffers(), root_rank=0)

    def _on_device(self, x: Any, y: Any) -> tuple[Inputs, Any]:
        """A batch on the device; named inputs stay a dict, several targets a tuple."""
        labels = tuple(map(self._tensor, y)) if isinstance(y, tuple) else self._tensor(y)
        return self._inputs(x), labels

    def _inputs(self, x: Any) -> Inputs:
        if isinstance(x, dict):
            return {name: self._tensor(value) for name, value in x.items()}
        return self._tensor(x)

    def _tensor(self, array: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(array).to(self.device)

    def tensors(self, x: Any, y: Any) -> tuple[Any, Any]:
        inputs, labels = self._on_device(x, y)
        net = getattr(self, "net", None)
        turned = net is None or net.channels_first
        if turned and isinstance(inputs, torch.Tensor) and inputs.dim() == 4:
            inputs = inputs.permute(0, 3, 1, 2)  # a view, as torch's convolutions take it
        return inputs, labels

    def reseed(self, seed: int) -> None:
        net = getattr(self, "net", None)
        if net is None:
            seed_dropout(seed)
        else:
            net.reseed(seed)

    @property
    def layout(self) -> str:
        return self.net.layout

    @property
    def overlapping(self) -> bool:
        return self.exchange.choice.overlap

    def scale_learning_rate(self, factor: float) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] *= factor
        self.learning_rate *= factor

    def is_tensor(self, value: Any) -> bool:
        return isinstance(value, torch.Tensor)

    def backward(self, loss: torch.Tensor) -> None:
        self.stepping.scaled = True
        (loss if self.scaler is None else self.scaler.scale(loss)).backward()

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        self.exchange.holding = True
        try:
            yield
        finally:
            self.exchange.holding = False

    def step(
        self, batches: list[Batch], learning_rate: float, seed: int, carry: np.ndarray
    ) -> StepResult:
        started = time.perf_counter()
        self.exchange.began = started
        # Set before the backward pass: sharded, the update may begin within it.
        for group, ratio in zip(self.optimizer.param_groups, self.rate_ratios, strict=True):
            group["lr"] = learning_rate * ratio
        losses = []
        for index, (x, y) in enumerate(batches):
            self.net.reseed(seed + index)
            inputs, labels = self._on_device(x, y)
            loss = self.loss(self.net.forward(inputs, training=True), labels)
            # The batches' gradients add up in .grad, to their mean. (One batch: no division,
            # whose op and its backward would add to every step's fixed costs.)
            self.backward(loss if len(batches) == 1 else loss / len(batches))
            losses.append(loss.detach())
        mean = losses[0] if len(losses) == 1 else torch.stack(losses).mean()
        computed = time.perf_counter()
        control = np.append(carry, float(mean))
        # Inside no_sync, this rank's own (the step updates with its own gradients).
        averaged = control if self.exchange.holding else self.exchange.synchronize(control)
        synced = time.perf_counter()
        hide = computed - (self.exchange.first_full or computed)
        self.stepping.measured = True  # the step reports whether the gradients are finite
        self.optimizer.step()
        self.exchange.clear()
        norm = self.stepping.norm
        finite = norm is None or bool(norm.isfinite())
        return StepResult(float(averaged[-1]), finite, None if norm is None else float(norm),
                          averaged[:-1], computed - started, synced - computed, hide)  # fmt: skip

    def input_names(self) -> tuple[str, ...] | None:
        return self.net.input_names()

    @torch.no_grad()
    def eval_batch(self, x: Any, y: Any = None) -> tuple[float, np.ndarray]:
        outputs = self.net.forward(self._inputs(x), training=False)
        if y is None:
            return np.nan, outputs.cpu().numpy()
        loss = self.loss(outputs, self._on_device(x, y)[1])
        return float(loss) * batch_size(x), outputs.cpu().numpy()

    def export(self, path: Path, format: str, example: np.ndarray) -> Exported:
        from hvd_train.distributed.torch.export import export

        return export(self.net, path, format, (self._tensor(example),))

    def run_elastic(self, loop: Callable[[ElasticState], T]) -> T:
        from hvd_train.distributed.torch.elastic import ElasticTorchState

        state = ElasticTorchState(self)
        # The world changed: a new rank, a new share of the cores, and overlap decided anew.
        state.register_reset_callbacks([self._pin, self.exchange.choice.restart])
        return hvd.elastic.run(loop)(state)

    def state(self, optimizer: bool = True, weights: bool = True) -> ModelState:
        arrays = self.optimizer_state.arrays() if optimizer else {}
        return ModelState(self.net.weights() if weights else {}, self.net.trained_names(), arrays)

    def load_state(self, weights: Arrays | None = None, optimizer: Arrays | None = None) -> None:
        if weights is not None:
            self.net.load_weights(weights)
        if optimizer is not None:
            self.optimizer_state.load(optimizer)
