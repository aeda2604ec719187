"""One Horovod binding per process: the package loads no framework until a backend is chosen,
and a backend refuses to load beside the other framework's binding."""

import subprocess
import sys

import pytest

from tests.conftest import FRAMEWORKS, REPO

BINDINGS = {"torch": "horovod.torch", "tensorflow": "horovod.tensorflow"}


def python(code: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-c", code]
    return subprocess.run(command, capture_output=True, text=True, timeout=300)


def test_the_package_imports_no_framework():
    code = (
        "import sys, hvd_train.cli, hvd_train.training.trainer, hvd_train.commands.evaluate\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'tensorflow', 'keras', "
        "'horovod'}))"
    )
    assert python(code).stdout.strip() == "[]"


# What a training process of the packaged recipe loads besides its binding: Keras comes with
# TensorFlow; under torch it would cost seconds of every start, and torch would under TensorFlow.
# Nor does MNIST load pyarrow (Parquet's reader), but TensorFlow's import does (through pandas).
LOADED = {"torch": ["torch"], "tensorflow": ["keras", "pyarrow", "tensorflow"]}


@pytest.mark.slow
@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_a_training_process_loads_only_its_own_binding(framework, mnist_dir, tmp_path):
    arguments = ["--framework", framework, "--data-dir", str(mnist_dir), "--epochs", "1",
                 "--limit-steps", "2", "--output-dir", str(tmp_path)]  # fmt: skip
    code = (
        "import sys\nfrom hvd_train.cli import main\n"
        f"assert main({arguments!r}) == 0\n"
        f"print(sorted(m for m in sys.modules if m in {set(BINDINGS.values())!r}))\n"
        f"print(sorted(m for m in sys.modules if m in {set(BINDINGS)!r} | {{'keras', 'pyarrow'}}))"
    )
    result = python(code)
    assert result.returncode == 0, result.stderr
    bindings, frameworks = result.stdout.strip().splitlines()[-2:]
    assert bindings == repr([BINDINGS[framework]])
    assert frameworks == repr(LOADED[framework])


@pytest.mark.slow
@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_a_backend_refuses_to_load_beside_the_other_binding(framework):
    other = "tensorflow" if framework == "torch" else "torch"
    code = (
        f"import {BINDINGS[other]}\nfrom hvd_train.distributed import Distributed\n"
        f"Distributed({framework!r})"
    )
    result = python(code)
    assert result.returncode != 0
    assert f"RuntimeError: {BINDINGS[other]} is loaded already" in result.stderr


@pytest.mark.slow
@pytest.mark.torch
def test_a_keras_model_under_torch_never_loads_tensorflow(mnist_dir, tmp_path):
    recipe = REPO / "recipes" / "examples" / "mnist_resnet_keras.py"
    arguments = ["--framework", "torch", "--recipe", str(recipe), "--data-dir", str(mnist_dir),
                 "--limit-steps", "2", "--output-dir", str(tmp_path)]  # fmt: skip
    code = (
        "import sys\nfrom hvd_train.cli import main\n"
        f"assert main({arguments!r}) == 0\n"
        "import keras\nprint(keras.backend.backend(), 'tensorflow' in sys.modules)"
    )
    result = python(code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "torch False"
