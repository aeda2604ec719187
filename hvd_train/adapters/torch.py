"""PyTorch under Horovod.

The model is a `torch.nn.Module`: built from the neutral layer list, a recipe's own module, or a
Keras 3 model on Keras's torch backend (whose layers are torch modules too). Either way the
gradients of its trainable parameters are averaged over the ranks in one grouped Horovod
allreduce after the step's backward passes, as the TensorFlow adapter does.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from typing import Any

import horovod.torch as hvd
import numpy as np
import torch
import torch.nn.functional as F
from horovod.common.elastic import ObjectState
from torch import nn

from hvd_train.adapters.base import Adapter, Arrays, Batch, ElasticState, Loss, StepResult, T
from hvd_train.builders import keras_models
from hvd_train.recipe.settings import Horovod, Optimizer


def seed_dropout(seed: int) -> None:
    """Seeds the generators dropout draws from, before each batch. The same numbers as
    torch.manual_seed, which also visits every other accelerator backend: 0.24 ms a step on
    CPU against 2 us here, about 1% of mnist_cnn's step on one core."""
    torch.default_generator.manual_seed(seed)
    if torch.cuda.is_initialized():
        torch.cuda.manual_seed(seed)


class TorchModule:
    """A torch module as the adapter drives it. Images arrive channels-last (N, H, W, C) and
    are handed to the module as torch's (N, C, H, W)."""

    def __init__(self, module: nn.Module) -> None:
        self.module = module

    def forward(self, x: torch.Tensor, training: bool) -> torch.Tensor:
        self.module.train(training)
        return self.module(x.permute(0, 3, 1, 2) if x.dim() == 4 else x)

    def reseed(self, seed: int) -> None:
        seed_dropout(seed)

    def trainable(self) -> list[tuple[str, torch.Tensor]]:
        return [(n, p) for n, p in self.module.named_parameters() if p.requires_grad]

    def buffers(self) -> dict[str, torch.Tensor]:
        return dict(self.module.named_buffers())

    def state(self) -> dict[str, torch.Tensor]:
        return self.module.state_dict()

    def weights(self) -> Arrays:
        state = self.module.state_dict()
        return {name: tensor.detach().cpu().numpy().copy() for name, tensor in state.items()}

    def load_weights(self, weights: Arrays) -> None:
        state = {name: torch.from_numpy(array) for name, array in weights.items()}
        self.module.load_state_dict(state, strict=True)


class KerasOnTorch:
    """A Keras 3 model on Keras's torch backend: channels-last inputs, Keras's `training` flag
    and seed generators, and its weights in the "keras" layout."""

    def __init__(self, model: Any) -> None:
        self.module = model
        self.seed_states = keras_models.seed_states(model)

    def forward(self, x: torch.Tensor, training: bool) -> torch.Tensor:
        output: torch.Tensor = self.module(x, training=training)
        return output

    def reseed(self, seed: int) -> None:
        seed_dropout(seed)
        for index, state in enumerate(self.seed_states):
            state.assign(np.array([seed, index], dtype=state.dtype))

    def trainable(self) -> list[tuple[str, torch.Tensor]]:
        return [(v.path, v.value) for v in self.module.trainable_variables]

    def buffers(self) -> dict[str, torch.Tensor]:
        return {v.path: v.value for v in self.module.non_trainable_weights}

    def state(self) -> dict[str, torch.Tensor]:
        return {v.path: v.value for v in self.module.weights}

    def weights(self) -> Arrays:
        return keras_models.weights(self.module)

    def load_weights(self, weights: Arrays) -> None:
        keras_models.load_weights(self.module, weights)


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
        self.optimizer = self.adapter.optimizer_state()
        super().save()

    def restore(self) -> None:
        with torch.no_grad():
            for name, tensor in self.adapter.net.state().items():
                tensor.copy_(self.model[name])
        self.adapter.load_optimizer_state(self.optimizer)
        super().restore()

    def sync(self) -> None:
        self.adapter.broadcast_state(include_optimizer=True)
        super().sync()


class TorchAdapter(Adapter):
    name = "torch"
    hvd = hvd

    def init(self) -> None:
        self.apply_horovod_defaults()
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

    def setup(self, model: Any, optimizer: Optimizer, loss: Loss, horovod: Horovod) -> None:
        keras = sys.modules.get("keras")
        self.net: TorchModule | KerasOnTorch
        if keras is not None and isinstance(model, keras.Model):
            self.net = KerasOnTorch(model)
        else:
            self.net = TorchModule(model.to(self.device))
        self.loss: Callable[[Any, Any], torch.Tensor] = (
            F.cross_entropy if loss == "cross_entropy" else loss  # type: ignore[assignment]
        )
        self.clip_norm = optimizer.gradient_clip_norm
        fp16 = horovod.fp16_compression
        self.compression = hvd.Compression.fp16 if fp16 else hvd.Compression.none
        self.optimizer = _optimizer(optimizer, [p for _, p in self.net.trainable()])

    def broadcast_state(self, include_optimizer: bool) -> None:
        if include_optimizer:
            self._broadcast_optimizer_state()
        hvd.broadcast_parameters(self.net.state(), root_rank=0)

    def _broadcast_optimizer_state(self) -> None:
        """Rank 0's optimizer state, exactly, even empty: its layout first (names, shapes), then
        its tensors in place. Horovod's broadcast_optimizer_state instead makes state on ranks
        that have none by taking a step with zero gradients, which moves weights under weight
        decay (see ElasticTorchState)."""
        state = self.optimizer_state()
        layout = self.broadcast_object({n: (a.shape, a.dtype.str) for n, a in state.items()})
        if not self.is_rank_zero:
            self.load_optimizer_state({n: np.zeros(s, d) for n, (s, d) in layout.items()})
        parameters = [p for group in self.optimizer.param_groups for p in group["params"]]
        tensors = {
            f"{index}.{key}": value
            for index, parameter in enumerate(parameters)
            for key, value in self.optimizer.state.get(parameter, {}).items()
        }
        hvd.broadcast_parameters(tensors, root_rank=0)

    def sync_buffers(self) -> None:
        hvd.broadcast_parameters(self.net.buffers(), root_rank=0)

    def _tensors(self, x: np.ndarray, y: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.from_numpy(x).to(self.device), torch.from_numpy(y).to(self.device)

    def train_step(
        self, batches: list[Batch], learning_rate: float, seed: int, flags: np.ndarray
    ) -> StepResult:
        started = time.perf_counter()
        losses = []
        for index, (x, y) in enumerate(batches):
            self.net.reseed(seed + index)
            inputs, labels = self._tensors(x, y)
            loss = self.loss(self.net.forward(inputs, training=True), labels)
            (loss / len(batches)).backward()  # the batches' gradients add up in .grad
            losses.append(loss.detach())
        parameters = [p for _, p in self.net.trainable()]
        loss = torch.stack(losses).mean().float().cpu().reshape(1)
        control = torch.cat([torch.from_numpy(np.asarray(flags, np.float32)), loss])
        computed = time.perf_counter()
        if self.exchanges:
            control = self._average(parameters, control)
        synced = time.perf_counter()
        for group in self.optimizer.param_groups:
            group["lr"] = learning_rate
        norm = nn.utils.get_total_norm([p.grad for p in parameters if p.grad is not None])
        if self.clip_norm:
            nn.utils.clip_grads_with_norm_(parameters, self.clip_norm, norm)
        self.optimizer.step()
        self.optimizer.zero_grad()
        return StepResult(float(control[-1]), float(norm), control[:-1].numpy() * self.world_size,
                          computed - started, synced - computed)  # fmt: skip

    def _average(self, parameters: list[torch.Tensor], control: torch.Tensor) -> torch.Tensor:
        """Averages the gradients over the ranks, and the control values (flags and
        loss) with them: one grouped allreduce after the backward passes, so one negotiation
        and, uncompressed, one fused exchange per step. (Horovod's DistributedOptimizer
        instead sends each gradient as the backward pass makes it; on CPU that exchange takes
        the cores the backward pass needs, and it measured slower here: docs/performance.md.)
        The control values travel uncompressed. A parameter this rank left without a gradient
        sends zeros, as another rank may have one."""
        gradients = [torch.zeros_like(p) if p.grad is None else p.grad for p in parameters]
        sent, contexts = zip(*map(self.compression.compress, gradients), strict=True)
        *averages, control = hvd.grouped_allreduce([*sent, control], op=hvd.Average,
                                                   name="hvd_train.step")  # fmt: skip
        for parameter, average, context in zip(parameters, averages, contexts, strict=True):
            parameter.grad = self.compression.decompress(average, context)
        return control

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
        self.optimizer.zero_grad()

    def gradient_allreduce(self) -> Callable[[], Any]:
        dtype = torch.float16 if self.compression is hvd.Compression.fp16 else torch.float32
        tensors = [torch.zeros(p.shape, dtype=dtype) for _, p in self.net.trainable()]
        return lambda: hvd.grouped_allreduce(tensors, op=hvd.Average, name="hvd_train.bench")

    @torch.no_grad()
    def logits(self, x: np.ndarray) -> np.ndarray:
        inputs = torch.from_numpy(x).to(self.device)
        return self.net.forward(inputs, training=False).cpu().numpy()

    @torch.no_grad()
    def eval_sums(self, x: np.ndarray, y: np.ndarray) -> tuple[float, int]:
        inputs, labels = self._tensors(x, y)
        logits = self.net.forward(inputs, training=False)
        loss = float(self.loss(logits, labels)) * len(labels)
        return loss, int((logits.argmax(dim=1) == labels).sum())

    def allreduce_sum(self, values: np.ndarray) -> np.ndarray:
        tensor = torch.from_numpy(np.asarray(values, dtype=np.float64))
        return hvd.allreduce(tensor, op=hvd.Sum, name="hvd_train.metrics").numpy()

    def run_elastic(self, loop: Callable[[ElasticState], T]) -> T:
        state = ElasticTorchState(self)
        state.register_reset_callbacks([self._pin])  # the world changed: new rank, new share
        return hvd.elastic.run(loop)(state)

    def weights(self) -> Arrays:
        return self.net.weights()

    def load_weights(self, weights: Arrays) -> None:
        self.net.load_weights(weights)

    def trained_state(self) -> Arrays:
        weights = {f"weight.{n}": p.detach().cpu().numpy() for n, p in self.net.trainable()}
        return weights | {f"optimizer.{n}": a for n, a in self.optimizer_state().items()}

    def optimizer_state(self) -> Arrays:
        """Each parameter's state tensors, keyed `<param index>.<name>` (`0.exp_avg`, ...)."""
        state = self.optimizer.state_dict()["state"]
        return {
            f"{index}.{key}": value.detach().cpu().numpy().copy()
            for index, entries in state.items()
            for key, value in entries.items()
        }

    def load_optimizer_state(self, state: Arrays) -> None:
        """Restores `state`, which must hold state for every parameter, shaped like it."""
        entries: dict[int, dict[str, torch.Tensor]] = {}
        for name, array in state.items():
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
        self.optimizer.load_state_dict({"state": entries, "param_groups": current["param_groups"]})


def _optimizer(config: Optimizer, parameters: list[torch.Tensor]) -> torch.optim.Optimizer:
    """The recipe's optimizer in its fused form: one kernel updates every parameter (on CPU
    too), where torch's default runs several ops per parameter group. Adam's update of
    mnist_cnn on one core: 0.20 ms fused, 0.65 ms by default."""
    lr, decay = config.learning_rate, config.weight_decay
    if config.name == "sgd":
        return torch.optim.SGD(
            parameters, lr=lr, momentum=config.momentum, weight_decay=decay, fused=True
        )
    kind = torch.optim.Adam if config.name == "adam" else torch.optim.AdamW
    return kind(parameters, lr=lr, weight_decay=decay, fused=True)
