"""PyTorch under Horovod."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import horovod.torch as hvd
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from hvd_train.adapters.base import Adapter, Arrays, ElasticState, T
from hvd_train.recipe import Recipe


class ChannelsLastFlatten(nn.Module):
    """Flattens (N, C, H, W) in (H, W, C) order, the framework-neutral order of the recipe."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x.permute(0, 2, 3, 1) if x.dim() == 4 else x).flatten(1)


def build_model(recipe: Recipe) -> nn.Sequential:
    """The recipe's layers, named by their index in the recipe; the final softmax is left to
    the loss (cross-entropy on logits is the numerically stable form)."""
    height, width, channels = recipe.input_shape
    features = channels * height * width
    modules: dict[str, nn.Module] = {}
    for index, layer in enumerate(recipe.layers[:-1]):
        params = layer.params
        match layer.type:
            case "conv2d":
                modules[str(index)] = nn.Conv2d(channels, params["filters"], params["kernel_size"])
                channels = params["filters"]
                height -= params["kernel_size"] - 1
                width -= params["kernel_size"] - 1
            case "maxpool2d":
                modules[str(index)] = nn.MaxPool2d(params["pool_size"])
                height //= params["pool_size"]
                width //= params["pool_size"]
            case "flatten":
                modules[str(index)] = ChannelsLastFlatten()
                features = channels * height * width
            case "dense":
                modules[str(index)] = nn.Linear(features, params["units"])
                features = params["units"]
            case "dropout":
                modules[str(index)] = nn.Dropout(params["rate"])
            case "relu":
                modules[str(index)] = nn.ReLU()
    return nn.Sequential(OrderedDict(modules))


def to_neutral(name: str, tensor: torch.Tensor) -> tuple[str, np.ndarray]:
    """('3.weight', conv weight (out, in, h, w)) -> ('layer3.kernel', (h, w, in, out))."""
    index, kind = name.split(".")
    array = tensor.detach().cpu().numpy()
    if kind == "weight":
        array = array.transpose(2, 3, 1, 0) if array.ndim == 4 else array.T
    return f"layer{index}.{'kernel' if kind == 'weight' else 'bias'}", array.copy(order="C")


def from_neutral(name: str, array: np.ndarray) -> tuple[str, torch.Tensor]:
    """The inverse of `to_neutral`."""
    layer, kind = name.split(".")
    if kind == "kernel":
        array = array.transpose(3, 2, 0, 1) if array.ndim == 4 else array.T
    return (
        f"{layer.removeprefix('layer')}.{'weight' if kind == 'kernel' else 'bias'}",
        torch.from_numpy(np.ascontiguousarray(array)),
    )


class TorchAdapter(Adapter):
    name = "torch"
    supports_elastic = True

    def init(self) -> None:
        hvd.init()
        self._pin()

    def _pin(self) -> None:
        self.rank, self.local_rank = hvd.rank(), hvd.local_rank()
        self.world_size, self.local_size = hvd.size(), hvd.local_size()
        if torch.cuda.is_available():
            torch.cuda.set_device(self.local_rank)
            self.device = torch.device("cuda", self.local_rank)
        else:
            torch.set_num_threads(self.threads_per_rank())
            self.device = torch.device("cpu")

    def build(self, recipe: Recipe, seed: int) -> None:
        torch.manual_seed(seed)
        self.model = build_model(recipe).to(self.device)
        self.clip_norm = recipe.optimizer.gradient_clip_norm
        self.passes_per_step = recipe.horovod.backward_passes_per_step
        self.passes = 0
        compression = (
            hvd.Compression.fp16 if recipe.horovod.fp16_compression else hvd.Compression.none
        )
        self.optimizer = hvd.DistributedOptimizer(
            _optimizer(recipe, self.model.parameters()),
            named_parameters=self.model.named_parameters(),
            compression=compression,
            backward_passes_per_step=self.passes_per_step,
        )

    def broadcast_state(self, include_optimizer: bool) -> None:
        # A fresh optimizer holds no state, and Horovod would create it by taking a zero-gradient
        # step (which moves weights under weight decay): broadcast it only when it was loaded.
        if include_optimizer:
            hvd.broadcast_optimizer_state(self.optimizer, root_rank=0)
        hvd.broadcast_parameters(self.model.state_dict(), root_rank=0)

    def _inputs(self, images: np.ndarray) -> torch.Tensor:
        # NHWC from the data pipeline to the NCHW that torch's convolutions expect.
        return torch.from_numpy(images).to(self.device).permute(0, 3, 1, 2)

    def train_step(
        self, images: np.ndarray, labels: np.ndarray, learning_rate: float, seed: int
    ) -> float:
        torch.manual_seed(seed)
        self.model.train()
        loss = F.cross_entropy(
            self.model(self._inputs(images)), torch.from_numpy(labels).to(self.device)
        )
        # With several backward passes per step, gradients accumulate: average them.
        (loss / self.passes_per_step).backward()
        self.passes += 1
        if self.passes % self.passes_per_step == 0:
            for group in self.optimizer.param_groups:
                group["lr"] = learning_rate
            self._step()
            self.optimizer.zero_grad()
        return float(loss.item())

    def _step(self) -> None:
        if not self.clip_norm:
            self.optimizer.step()
            return
        # Clip the averaged gradients, not the local ones: finish the allreduce first.
        self.optimizer.synchronize()
        nn.utils.clip_grad_norm_(self.model.parameters(), self.clip_norm)
        with self.optimizer.skip_synchronize():
            self.optimizer.step()

    @torch.no_grad()
    def logits(self, images: np.ndarray) -> np.ndarray:
        self.model.eval()
        return self.model(self._inputs(images)).cpu().numpy()

    def allreduce_sum(self, values: np.ndarray) -> np.ndarray:
        tensor = torch.from_numpy(np.asarray(values, dtype=np.float64))
        return hvd.allreduce(tensor, op=hvd.Sum, name="hvd_train.metrics").numpy()

    def broadcast_object(self, value: Any) -> Any:
        return hvd.broadcast_object(value, root_rank=0)

    def allgather_object(self, value: Any) -> list[Any]:
        return list(hvd.allgather_object(value))

    def run_elastic(self, loop: Callable[[ElasticState], T], epoch: int, samples: int) -> T:
        state = hvd.elastic.TorchState(
            model=self.model, optimizer=self.optimizer, epoch=epoch, samples=samples
        )
        state.register_reset_callbacks([self._pin])  # the world changed: new rank, new share
        return hvd.elastic.run(loop)(state)

    def weights(self) -> Arrays:
        return dict(to_neutral(name, tensor) for name, tensor in self.model.state_dict().items())

    def load_weights(self, weights: Arrays) -> None:
        state = dict(from_neutral(name, array) for name, array in weights.items())
        self.model.load_state_dict(state)

    def optimizer_state(self) -> Arrays:
        """Each parameter's state tensors, keyed `<param index>.<name>` (`0.exp_avg`, ...)."""
        state = self.optimizer.state_dict()["state"]
        return {
            f"{index}.{key}": value.detach().cpu().numpy().copy()
            for index, entries in state.items()
            for key, value in entries.items()
        }

    def load_optimizer_state(self, state: Arrays) -> None:
        entries: dict[int, dict[str, torch.Tensor]] = {}
        for name, array in state.items():
            index, key = name.split(".", 1)
            entries.setdefault(int(index), {})[key] = torch.from_numpy(array)
        current = self.optimizer.state_dict()
        self.optimizer.load_state_dict({"state": entries, "param_groups": current["param_groups"]})


def _optimizer(recipe: Recipe, parameters: Any) -> torch.optim.Optimizer:
    config = recipe.optimizer
    lr = config.learning_rate
    if config.name == "sgd":
        return torch.optim.SGD(
            parameters, lr=lr, momentum=config.momentum, weight_decay=config.weight_decay
        )
    if config.name == "adam":
        return torch.optim.Adam(parameters, lr=lr, weight_decay=config.weight_decay)
    return torch.optim.AdamW(parameters, lr=lr, weight_decay=config.weight_decay)
