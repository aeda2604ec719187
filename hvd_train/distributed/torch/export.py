"""A torch model for serving, loadable without hvd_train: a `torch.export` program (TorchScript
where torch.export cannot capture the model), or ONNX."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import logging
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from hvd_train.distributed.backend import Exported
from hvd_train.distributed.torch.modules import Net, in_fp32
from hvd_train.errors import UsageError


class Served(nn.Module):
    """The model as it is exported: it takes inputs as the data gives them (images
    channels-last, turned for a torch module as the backend turns them) and returns fp32
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


def export(net: Net, path: Path, format: str, inputs: tuple[torch.Tensor]) -> Exported:
    """`net` written for serving in `format` ("torch" or "onnx") at `path`, computing as in
    training (but for ONNX and TorchScript: in fp32)."""
    served = Served(net.module, net.channels_first).eval()
    batch = {0: torch.export.Dim("batch", min=1)}  # any batch size
    if format == "onnx":  # in fp32: ONNX Runtime lacks bf16 kernels (its CPU convolution)
        with in_fp32(net.module):
            return path, _outputs(served, inputs), export_onnx(served, inputs, batch, path)
    try:
        with _quiet_torch_export():
            program = torch.export.export(served, inputs, dynamic_shapes=(batch,))
    except Exception as error:  # torch.export's failures have many types
        # TorchScript cannot compile autocast on a device read from the input: fp32.
        path = path.with_suffix(".pt")
        with in_fp32(net.module):
            return path, _outputs(served, inputs), export_torchscript(served, inputs, path, error)
    torch.export.save(program, path)
    reloaded = torch.export.load(path).module()
    return path, _outputs(served, inputs), reloaded(*inputs).detach().cpu().numpy()


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
