"""Horovod's own TensorFlow API on Keras 3 (patches 16-keras3-variables and
20-keras3-callbacks-and-elastic-state): each call against a one-process reference, and each of
Horovod v0.28.1's seven `examples/tensorflow2` scripts run to its end under the real
horovodrun, the elastic ones under its elastic launcher on this one host as Horovod's docs show
it. A script is run as its users have it, with only what docs/frameworks.md names Keras 3's two
line changes, its steps capped (its own arguments where it has them, else its numbers), and
MNIST read from the local files."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.horovodrun import script

HOROVODRUN = Path(sys.executable).parent / "horovodrun"
EXAMPLES = REPO.parent / "shared" / "horovod-v0.28.1-examples"
# What a synthetic benchmark runs: a small model, a few steps, on the CPU.
SYNTHETIC = ["--model", "MobileNetV2", "--batch-size", "4", "--num-iters", "2",
             "--num-batches-per-iter", "2", "--no-cuda"]  # fmt: skip

pytestmark = [pytest.mark.multiprocess, pytest.mark.tensorflow, pytest.mark.slow]


def two_ranks(*arguments: str, cwd: Path | None = None, elastic: bool = False) -> str:
    options = ["-np", "2", "--gloo"]
    if elastic:  # as Horovod's docs show it: no --network-interface
        discover = (cwd or Path.cwd()) / "discover.sh"
        discover.write_text("#!/bin/sh\necho localhost:2\n")
        discover.chmod(0o755)
        options += ["--min-np", "1", "--max-np", "2", "--host-discovery-script", str(discover)]
    command = [str(HOROVODRUN), *options, sys.executable, *arguments]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=cwd)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    return output


def keras3_copy(name: str, folder: Path, caps: dict[str, str]) -> Path:
    """The example `name` in `folder` with Keras 3's two line changes (where it has them) and
    `caps` (each text replaced once, exactly)."""
    text = (EXAMPLES / name).read_text()
    # Keras 3: an optimizer's variables are a list, and compile() takes no
    # experimental_run_tf_function.
    text = text.replace("opt.variables()", "opt.variables")
    text = re.sub(r",\s*experimental_run_tf_function=False\)", ")", text)
    for old, new in caps.items():
        assert text.count(old) == 1, f"{name} no longer holds {old!r} once"
        text = text.replace(old, new)
    copy = folder / name
    copy.write_text(text)
    return copy


def test_each_api_averages_as_one_process_does():
    output = two_ranks(script("horovod/keras3_apis.py"))
    assert sorted(re.findall(r"\[\d\]<stdout>:OK", output)) == ["[0]<stdout>:OK", "[1]<stdout>:OK"]


needs_examples = pytest.mark.skipif(
    not EXAMPLES.is_dir(), reason=f"Horovod's examples are not at {EXAMPLES}"
)


def step_losses(output: str) -> list[float]:
    return [float(v) for v in re.findall(r"\[0\]<stdout>:Step #\d+\tLoss: ([\d.]+)", output)]


def mnist_example(name: str, mnist_dir: Path, folder: Path, caps: dict[str, str],
                  elastic: bool = False) -> str:  # fmt: skip
    """What `name` (a script that reads MNIST) printed at np=2, run in `folder`."""
    copy = keras3_copy(name, folder, caps)
    runner = script("horovod/horovod_example.py")
    return two_ranks(runner, str(copy), str(mnist_dir), cwd=folder, elastic=elastic)


@needs_examples
def test_tensorflow2_mnist_learns_and_saves(mnist_dir, tmp_path):
    caps = {"10000 // hvd.size()": "120 // hvd.size()"}
    output = mnist_example("tensorflow2_mnist.py", mnist_dir, tmp_path, caps)
    losses = step_losses(output)
    assert len(losses) == 6 and losses[-1] < losses[0] / 2, output
    assert list(tmp_path.glob("checkpoints-*.index")), "rank 0 saved no checkpoint"


@needs_examples
def test_tensorflow2_keras_mnist_runs_its_callbacks_and_saves(mnist_dir, tmp_path):
    caps = {"500 // hvd.size()": "40 // hvd.size()", "epochs=24": "epochs=4"}
    output = mnist_example("tensorflow2_keras_mnist.py", mnist_dir, tmp_path, caps)
    # LearningRateWarmupCallback reached the scaled rate (0.001 x 2) at its third epoch's end.
    assert "Epoch 3: finished gradual learning rate warmup to 0.002." in output, output
    assert (tmp_path / "checkpoint-4.h5").is_file(), output


@needs_examples
def test_tensorflow2_mnist_elastic_trains_on_one_host(mnist_dir, tmp_path):
    output = mnist_example("tensorflow2_mnist_elastic.py", mnist_dir, tmp_path, {}, elastic=True)
    losses = step_losses(output)
    assert len(losses) == 5 and losses[-1] < losses[0], output
    assert list(tmp_path.glob("checkpoints-*.index")), "rank 0 saved no checkpoint"


@needs_examples
def test_tensorflow2_keras_mnist_elastic_trains_on_one_host(mnist_dir, tmp_path):
    caps = {"500 // hvd.size()": "40 // hvd.size()", "24-state.epoch": "2-state.epoch"}
    name = "tensorflow2_keras_mnist_elastic.py"
    output = mnist_example(name, mnist_dir, tmp_path, caps, elastic=True)
    assert "Epoch 2/2" in output and (tmp_path / "checkpoint-2.h5").is_file(), output


SYNTHETIC_SCRIPTS = ["tensorflow2_synthetic_benchmark.py",
                     "tensorflow2_keras_synthetic_benchmark.py",
                     "tensorflow2_synthetic_benchmark_elastic.py"]  # fmt: skip


@needs_examples
@pytest.mark.parametrize("name", SYNTHETIC_SCRIPTS)
def test_synthetic_benchmark_runs_to_its_result(name, tmp_path):
    copy = keras3_copy(name, tmp_path, {})
    arguments = SYNTHETIC if "keras" in name else [*SYNTHETIC, "--num-warmup-batches", "1"]
    output = two_ranks(str(copy), *arguments, cwd=tmp_path, elastic="elastic" in name)
    assert re.search(r"Total img/sec on 2 CPU\(s\): [\d.]+ \+-[\d.]+", output), output
