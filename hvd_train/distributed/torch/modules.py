"""The model as the torch backend drives it: a torch module, or a Keras 3 model on Keras's torch
backend (whose layers are torch modules too), behind one `Net` protocol; and mixed precision,
which makes a module compute under `torch.autocast`."""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator
from typing import Any, Protocol

import torch
import torch.nn.functional as F
from torch import nn

from hvd_train.distributed.checkpoint_files import Arrays

Inputs = torch.Tensor | dict[str, torch.Tensor]  # named inputs: a dict
# The dtype torch.autocast computes in for each precision (None: fp32, no autocast).
AUTOCAST = {"fp32": None, "bf16-mixed": torch.bfloat16, "fp16-mixed": torch.float16}


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


class Net(Protocol):
    """A model as the backend drives it."""

    module: nn.Module
    layout: str  # how a checkpoint holds its own weights: "torch" or "keras"
    channels_first: bool  # whether images are turned to (N, C, H, W) for it

    def forward(self, x: Inputs, training: bool) -> torch.Tensor: ...

    def input_names(self) -> tuple[str, ...] | None: ...

    def reseed(self, seed: int) -> None: ...

    def trainable(self) -> list[tuple[str, torch.Tensor]]: ...

    def layer_types(self) -> list[str]: ...

    def buffers(self) -> dict[str, torch.Tensor]: ...

    def state(self) -> dict[str, torch.Tensor]: ...

    def trained_names(self) -> tuple[str, ...]: ...

    def weights(self) -> Arrays: ...

    def load_weights(self, weights: Arrays) -> None: ...


class TorchModule:
    """A torch module. Images arrive channels-last (N, H, W, C) and are handed to it as torch's
    (N, C, H, W); its outputs come back as fp32 for the loss."""

    layout, channels_first = "torch", True

    def __init__(self, module: nn.Module) -> None:
        self.module = module
        module.train()  # every part in one mode, so that `forward` can read the module's own

    def forward(self, x: Inputs, training: bool) -> torch.Tensor:
        """The module's outputs on `x`: a tensor, or named inputs as keyword arguments. The
        mode is set on the whole module only when it changes: it visits every submodule."""
        if training is not self.module.training:
            self.module.train(training)
        if isinstance(x, dict):
            output: torch.Tensor = self.module(**x)
        else:
            output = self.module(x.permute(0, 3, 1, 2) if x.dim() == 4 else x)
        return output.float()

    def input_names(self) -> tuple[str, ...] | None:
        """`forward`'s parameters by name (None with a **kwargs)."""
        parameters = inspect.signature(self.module.forward).parameters.values()
        if any(p.kind is p.VAR_KEYWORD for p in parameters):
            return None
        return tuple(p.name for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD,
                                                              p.KEYWORD_ONLY))  # fmt: skip

    def reseed(self, seed: int) -> None:
        seed_dropout(seed)

    def trainable(self) -> list[tuple[str, torch.Tensor]]:
        return [(n, p) for n, p in self.module.named_parameters() if p.requires_grad]

    def layer_types(self) -> list[str]:
        """The type of the module holding each trainable parameter, in `trainable`'s order."""
        holder = {id(p): plain_type(m).__name__ for m in self.module.modules()
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


class KerasOnTorch:
    """A Keras 3 model on Keras's torch backend: channels-last inputs, Keras's `training` flag
    and seed generators, its weights in the "keras" layout, and its precision Keras's policy,
    set as it was built."""

    layout, channels_first = "keras", False

    def __init__(self, model: Any) -> None:
        from hvd_train.distributed import keras_state  # Keras only for a Keras model: seconds

        self.keras_state = keras_state
        self.module = model
        self.seed_states = keras_state.seed_states(model)

    def forward(self, x: Inputs, training: bool) -> torch.Tensor:
        output: torch.Tensor = self.module(x, training=training)  # named inputs: a dict
        return output.float()

    def input_names(self) -> tuple[str, ...] | None:
        return self.keras_state.input_names(self.module)

    def reseed(self, seed: int) -> None:
        seed_dropout(seed)
        for index, state in enumerate(self.seed_states):
            state.assign(self.keras_state.seed_state(seed, index, state.dtype))

    def trainable(self) -> list[tuple[str, torch.Tensor]]:
        return [(v.path, v.value) for v in self.module.trainable_variables]

    def layer_types(self) -> list[str]:
        return self.keras_state.layer_types(self.module)

    def buffers(self) -> dict[str, torch.Tensor]:
        return {v.path: v.value for v in self.module.non_trainable_weights}

    def state(self) -> dict[str, torch.Tensor]:
        return {v.path: v.value for v in self.module.weights}

    def trained_names(self) -> tuple[str, ...]:
        return self.keras_state.trained_names(self.module)

    def weights(self) -> Arrays:
        return self.keras_state.weights(self.module)

    def load_weights(self, weights: Arrays) -> None:
        self.keras_state.load_weights(self.module, weights)


def compute_in(module: nn.Module, dtype: torch.dtype, device: torch.device) -> None:
    """Makes `module` compute in `dtype` under torch.autocast, whoever calls it (the loop's own
    `model(x)` too), with its outputs as fp32; its weights stay fp32. Done as torch's
    parametrizations do it: the module's class becomes a subclass of its own, whose forward
    enters autocast, so the module keeps its identity, parameters and state_dict."""
    own = type(module)
    forward = _autocast_forward(own, dtype, device.type)
    module.__class__ = type(own.__name__, (own,), {"forward": forward, "_plain_class": own})


def _autocast_forward(own: type[nn.Module], dtype: torch.dtype, device_type: str) -> Any:
    def forward(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
        with torch.autocast(device_type, dtype):
            output = own.forward(self, *args, **kwargs)
        return output.float() if isinstance(output, torch.Tensor) else output

    return forward


def plain_type(module: nn.Module) -> type:
    """The module's own class, under `compute_in`'s."""
    return getattr(type(module), "_plain_class", type(module))


@contextlib.contextmanager
def in_fp32(module: nn.Module) -> Iterator[None]:
    """`module` computing in fp32 meanwhile, whatever `compute_in` made it do."""
    mixed = type(module)
    module.__class__ = plain_type(module)
    try:
        yield
    finally:
        module.__class__ = mixed
