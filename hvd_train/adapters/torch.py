"""PyTorch under Horovod.

The model is a `torch.nn.Module`: built from the neutral layer list, a recipe's own module, or a
Keras 3 model on Keras's torch backend (whose layers are torch modules too). Either way
Horovod's torch `DistributedOptimizer` averages the gradients of its trainable parameters.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import horovod.torch as hvd
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from hvd_train.adapters import torch_layers
from hvd_train.adapters.base import Adapter, Arrays, ElasticState, T, model_type_error
from hvd_train.layers import Layer, Shape
from hvd_train.recipe import Recipe
from hvd_train.recipe.settings import Optimizer


class TorchModule:
    """A torch module as the adapter drives it. Images arrive channels-last (N, H, W, C) and
    are handed to the module as torch's (N, C, H, W)."""

    def __init__(self, module: nn.Module, layers: tuple[Layer, ...]) -> None:
        self.module, self.layers = module, layers  # layers: the neutral list it was built from

    def forward(self, x: torch.Tensor, training: bool) -> torch.Tensor:
        self.module.train(training)
        return self.module(x.permute(0, 3, 1, 2) if x.dim() == 4 else x)

    def reseed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def trainable(self) -> list[tuple[str, torch.Tensor]]:
        return [(n, p) for n, p in self.module.named_parameters() if p.requires_grad]

    def buffers(self) -> dict[str, torch.Tensor]:
        return dict(self.module.named_buffers())

    def state(self) -> dict[str, torch.Tensor]:
        return self.module.state_dict()

    def weights(self) -> Arrays:
        state = self.module.state_dict()
        if self.layers:
            return torch_layers.to_neutral(self.layers, state)
        return {name: tensor.detach().cpu().numpy().copy() for name, tensor in state.items()}

    def load_weights(self, weights: Arrays) -> None:
        current = self.module.state_dict()
        if self.layers:
            state = torch_layers.from_neutral(self.layers, weights, current)
        else:
            state = {name: torch.from_numpy(array) for name, array in weights.items()}
        self.module.load_state_dict(state, strict=True)


class KerasOnTorch:
    """A Keras 3 model on Keras's torch backend: channels-last inputs, Keras's `training` flag
    and seed generators, and its weights in the "keras" layout."""

    def __init__(self, model: Any) -> None:
        from hvd_train.adapters import keras_models

        self.module, self.models = model, keras_models
        self.seed_states = keras_models.seed_states(model)

    def forward(self, x: torch.Tensor, training: bool) -> torch.Tensor:
        output: torch.Tensor = self.module(x, training=training)
        return output

    def reseed(self, seed: int) -> None:
        torch.manual_seed(seed)
        for index, state in enumerate(self.seed_states):
            state.assign(np.array([seed, index], dtype=state.dtype))

    def trainable(self) -> list[tuple[str, torch.Tensor]]:
        return [(v.path, v.value) for v in self.module.trainable_variables]

    def buffers(self) -> dict[str, torch.Tensor]:
        return {v.path: v.value for v in self.module.non_trainable_weights}

    def state(self) -> dict[str, torch.Tensor]:
        return {v.path: v.value for v in self.module.weights}

    def weights(self) -> Arrays:
        return self.models.weights(self.module, "keras")

    def load_weights(self, weights: Arrays) -> None:
        self.models.load_weights(self.module, "keras", weights)


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

    def seed(self, seed: int) -> None:
        # Keras's initialisers draw their seeds from Python's random. (keras.utils.
        # set_random_seed would do the same, but imports TensorFlow to seed it as well.)
        random.seed(seed)
        np.random.seed(seed % 2**32)
        torch.manual_seed(seed)

    def build_layers(self, layers: tuple[Layer, ...], input_shape: Shape) -> nn.Module:
        return torch_layers.build_layers(layers, input_shape)

    def setup(self, model: Any, recipe: Recipe) -> None:
        layout = recipe.layout(self.name)
        self.net: TorchModule | KerasOnTorch
        if layout == "keras":
            if not isinstance(model, nn.Module):
                raise model_type_error(recipe, "keras_model", "a Keras model", model)
            self.net = KerasOnTorch(model)
        else:
            if not isinstance(model, nn.Module):
                raise model_type_error(recipe, "torch_model", "a torch.nn.Module", model)
            self.net = TorchModule(model.to(self.device), recipe.layers)
        self.loss: Callable[[Any, Any], torch.Tensor] = (
            F.cross_entropy if recipe.loss == "cross_entropy" else recipe.loss  # type: ignore[assignment]
        )
        self.clip_norm = recipe.optimizer.gradient_clip_norm
        self.passes_per_step = recipe.horovod.backward_passes_per_step
        self.passes = 0
        compression = (
            hvd.Compression.fp16 if recipe.horovod.fp16_compression else hvd.Compression.none
        )
        trainable = self.net.trainable()
        self.optimizer = hvd.DistributedOptimizer(
            _optimizer(recipe.optimizer, [p for _, p in trainable]),
            named_parameters=trainable,
            compression=compression,
            backward_passes_per_step=self.passes_per_step,
        )

    def broadcast_state(self, include_optimizer: bool) -> None:
        # A fresh optimizer holds no state, and Horovod would create it by taking a zero-gradient
        # step (which moves weights under weight decay): broadcast it only when it was loaded.
        if include_optimizer:
            hvd.broadcast_optimizer_state(self.optimizer, root_rank=0)
        hvd.broadcast_parameters(self.net.state(), root_rank=0)

    def sync_buffers(self) -> None:
        hvd.broadcast_parameters(self.net.buffers(), root_rank=0)

    def _tensors(self, x: np.ndarray, y: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.from_numpy(x).to(self.device), torch.from_numpy(y).to(self.device)

    def train_step(self, x: np.ndarray, y: np.ndarray, learning_rate: float, seed: int) -> float:
        self.net.reseed(seed)
        inputs, labels = self._tensors(x, y)
        loss = self.loss(self.net.forward(inputs, training=True), labels)
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
        nn.utils.clip_grad_norm_([p for _, p in self.net.trainable()], self.clip_norm)
        with self.optimizer.skip_synchronize():
            self.optimizer.step()

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

    def broadcast_object(self, value: Any) -> Any:
        return hvd.broadcast_object(value, root_rank=0)

    def allgather_object(self, value: Any) -> list[Any]:
        return list(hvd.allgather_object(value))

    def run_elastic(self, loop: Callable[[ElasticState], T], epoch: int, samples: int) -> T:
        state = hvd.elastic.TorchState(
            model=self.net.module, optimizer=self.optimizer, epoch=epoch, samples=samples
        )
        state.register_reset_callbacks([self._pin])  # the world changed: new rank, new share
        return hvd.elastic.run(loop)(state)

    def weights(self) -> Arrays:
        return self.net.weights()

    def load_weights(self, weights: Arrays) -> None:
        self.net.load_weights(weights)

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


def _optimizer(config: Optimizer, parameters: list[torch.Tensor]) -> torch.optim.Optimizer:
    lr, decay = config.learning_rate, config.weight_decay
    if config.name == "sgd":
        return torch.optim.SGD(parameters, lr=lr, momentum=config.momentum, weight_decay=decay)
    if config.name == "adam":
        return torch.optim.Adam(parameters, lr=lr, weight_decay=decay)
    return torch.optim.AdamW(parameters, lr=lr, weight_decay=decay)
