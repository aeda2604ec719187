"""`hvd-train export`: a checkpoint as the framework's own serving form, loadable without
hvd_train: a `torch.export` program (TorchScript where it cannot), ONNX, a `.keras` file or a
TensorFlow SavedModel. A neutral recipe's checkpoint exports in all four. The export computes as
training did (mixed precision included), but for ONNX and TorchScript, which compute in fp32."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from hvd_train.commands.evaluate import load_weights, read_checkpoint
from hvd_train.data import take
from hvd_train.errors import UsageError
from hvd_train.frameworks import EXPORT_FORMATS
from hvd_train.recipe import load_data
from hvd_train.training.resume import saved_recipe
from hvd_train.training.run import open_run, start

EXAMPLES = 8  # test examples the export is checked on, loaded back
# How far a reloaded export's outputs may be from the model's: the same weights, run by
# another runtime (ONNX Runtime, XLA-less SavedModel) whose kernels sum in another order.
TOLERANCE = 1e-4


def export_checkpoint(
    path: Path, format: str, output: Path | None, data_dir: Path | None,
    recipe_reference: str | None = None,
) -> dict[str, Any]:  # fmt: skip
    """Writes `path`'s model in `format` (in the run's export/ folder unless `output` says
    where), checks it loaded back against the model's own outputs on test examples, and
    returns what was written and how far apart the two were."""
    framework, suffix = EXPORT_FORMATS[format]
    if output is not None:
        check_output(output, format, suffix)
    dist = start(framework)
    found = read_checkpoint(dist, path)
    recipe = saved_recipe(found, recipe_reference)
    if framework not in recipe.frameworks:
        raise UsageError(
            f"--format {format} writes a {framework} model, and the model of recipe "
            f"{recipe.name!r} is {' and '.join(recipe.frameworks)} only; choose --format "
            f"{' or '.join(f for f, (w, _) in EXPORT_FORMATS.items() if w in recipe.frameworks)}"
        )
    run = open_run(dist, recipe, seed=0, trains=False)
    load_weights(run, found, "export it with the recipe that wrote it")
    x, _ = take(load_data(recipe, data_dir).test, np.arange(EXAMPLES))
    if isinstance(x, dict):
        raise UsageError(
            f"the model of recipe {recipe.name!r} takes named inputs ({', '.join(x)}), and "
            "export takes models of one input array; load the checkpoint's model.safetensors "
            "into your model to serve it"
        )
    target = output or default_output(found.path, suffix)
    written, expected, outputs = dist.exchange.export(target, format, x)
    difference = None if outputs is None else float(np.abs(outputs - expected).max())
    if difference is not None and not difference <= TOLERANCE * max(1, np.abs(expected).max()):
        raise RuntimeError(f"{written} loaded back gives outputs {difference} from the model's")
    return {"export": str(written), "format": format, "checkpoint": str(found.path),
            "examples_checked": len(x) if difference is not None else 0,
            "max_difference": difference}  # fmt: skip


def check_output(output: Path, format: str, suffix: str) -> None:
    """-o names a file its loaders take (torch.export's and Keras's look at the suffix), in a
    folder that exists; a SavedModel is a folder of any name."""
    if format != "savedmodel" and output.suffix != suffix:
        raise UsageError(
            f"-o {output}: --format {format} writes a {suffix} file; name it "
            f"{output.with_suffix(suffix)}"
        )
    if not output.parent.is_dir():
        raise UsageError(f"-o {output}: the folder {output.parent} does not exist; create it")


def default_output(checkpoint: Path, suffix: str) -> Path:
    """RUN/export/<checkpoint's name><suffix> for a checkpoint in a run's checkpoints/ folder
    (out of the way of the checkpoints there), else beside the checkpoint."""
    if checkpoint.parent.name == "checkpoints":
        folder = checkpoint.parent.parent / "export"
        folder.mkdir(exist_ok=True)
        return folder / f"{checkpoint.name}{suffix}"
    return checkpoint.with_suffix(suffix)
