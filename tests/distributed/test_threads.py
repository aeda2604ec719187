"""How many threads a rank takes: its share of the cores it may use, a cgroup quota included;
and the Horovod, TensorFlow and malloc settings hvd_train applies."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hvd_train.distributed.host import available_cores, cgroup_cpu_quota
from tests.conftest import FRAMEWORKS

CORES = len(os.sched_getaffinity(0))
KERAS_RECIPE = Path(__file__).parents[2] / "recipes" / "examples" / "mnist_resnet_keras.py"


@pytest.mark.parametrize(
    ("files", "quota"),
    [
        ({"cpu.max": "150000 100000\n"}, 1.5),  # v2: --cpus=1.5
        ({"cpu.max": "max 100000\n"}, None),  # v2: unlimited
        ({"cpu/cpu.cfs_quota_us": "50000\n", "cpu/cpu.cfs_period_us": "100000\n"}, 0.5),  # v1
        ({"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, None),
        ({}, None),  # no cgroup files at all
    ],
)
def test_the_cgroup_quota_is_read_from_either_version(tmp_path, files, quota):
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert cgroup_cpu_quota(tmp_path) == quota


def test_a_quota_caps_the_cores_and_leaves_at_least_one(tmp_path):
    (tmp_path / "cpu.max").write_text("50000 100000\n")
    assert available_cores(tmp_path) == 1
    (tmp_path / "cpu.max").write_text(f"{CORES * 400000} 100000\n")  # more than there are
    assert available_cores(tmp_path) == CORES


@pytest.mark.slow
@pytest.mark.parametrize("framework", FRAMEWORKS)
@pytest.mark.parametrize(("given", "expected"), [(None, "3"), ("7", "7")])
def test_horovod_cycles_every_3_ms_unless_the_environment_says(framework, given, expected):
    # In its own process: pytest never loads a Horovod binding. hvd.init reads the variable,
    # so the backend sets it before; the probe prints what it was then.
    probe = ("import os; from hvd_train.distributed import Distributed; "
             f"Distributed({framework!r}); "
             "print(os.environ['HOROVOD_CYCLE_TIME'])")  # fmt: skip
    assert probe_output(probe, "HOROVOD_CYCLE_TIME", given) == expected


@pytest.mark.slow
@pytest.mark.parametrize(
    ("given", "expected"), [(None, "True"), ("0", "False")], ids=["default", "turned-off"]
)
@pytest.mark.parametrize(
    "first", ["create_backend('tensorflow')", "resolve_recipe(KERAS_RECIPE, 'tensorflow')"],
    ids=["backend", "keras-recipe"],
)  # fmt: skip
def test_tensorflow_runs_onednn_kernels_unless_the_environment_says(first, given, expected):
    # TensorFlow reads the variable once, as it loads, so hvd_train sets it before: before the
    # backend imports TensorFlow, and before a Python recipe importing Keras loads.
    probe = ("from hvd_train.distributed.backends import create_backend; "
             "from hvd_train.api import resolve_recipe; "
             f"KERAS_RECIPE = {str(KERAS_RECIPE)!r}; "
             f"{first}; "
             "from tensorflow.python.util import _pywrap_util_port; "
             "print(_pywrap_util_port.IsMklEnabled())")  # fmt: skip
    assert probe_output(probe, "TF_ENABLE_ONEDNN_OPTS", given) == expected


# A step's allocations as the passes make them: eight 4 MB blocks, written and freed; the minor
# page faults of ten such steps after a first one. glibc's default hands the freed blocks back
# to the system each step, and the next step faults every page in again.
STEPS = """
import ctypes, resource
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
def step():
    blocks = [libc.malloc(4 << 20) for _ in range(8)]
    for block in blocks:
        ctypes.memset(block, 1, 4 << 20)
    for block in reversed(blocks):
        libc.free(block)
step()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(10):
    step()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""
PAGES = 10 * 8 * (4 << 20) // 4096  # the pages those ten steps write


@pytest.mark.parametrize(
    ("first", "tunables", "kept"),
    [
        ("", None, False),
        ("from hvd_train.distributed.host import keep_freed_memory; keep_freed_memory()", None,
         True),
        ("from hvd_train.distributed.host import keep_freed_memory; keep_freed_memory()",
         "glibc.malloc.tcache_count=7", False),
    ],
    ids=["glibc-default", "kept", "environment-decides"],
)  # fmt: skip
def test_freed_memory_is_kept_for_the_next_step_unless_the_environment_sets_malloc(
    first, tunables, kept
):
    faults = int(probe_output(first + "\n" + STEPS, "GLIBC_TUNABLES", tunables))
    assert faults < PAGES // 100 if kept else faults > PAGES // 2


@pytest.mark.slow
@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_every_rank_keeps_freed_memory(framework):
    first = f"from hvd_train.distributed import Distributed; Distributed({framework!r})"
    assert int(probe_output(first + "\n" + STEPS, "GLIBC_TUNABLES", None)) < PAGES // 100


def probe_output(probe: str, variable: str, given: str | None) -> str:
    """The last word `python -c probe` prints, run with `variable` set to `given` (unset if
    None) and the rest of the environment as it is."""
    environment = {k: v for k, v in os.environ.items() if k != variable}
    if given:
        environment[variable] = given
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                            env=environment, timeout=300, check=True)  # fmt: skip
    return result.stdout.split()[-1]


@pytest.mark.slow
@pytest.mark.tensorflow
@pytest.mark.parametrize(
    ("recipe", "overrides", "spare"),
    [
        ("mnist_cnn", {}, 0),  # 0.74 MB of gradients: one bucket, sent after the pass anyway
        ("resnet18", {}, 1),  # a Python recipe's model: may overlap
        ("resnet18", {"overlap": False}, 0),
        ("mnist_mlp_wide", {}, 1),
    ],
)  # fmt: skip
def test_tensorflow_takes_a_spare_inter_op_thread_only_where_the_exchange_may_overlap(
    recipe, overrides, spare, tmp_path
):
    if recipe == "mnist_mlp_wide":  # a neutral model of 7.4 MB: two buckets
        recipe = str(tmp_path / "wide.toml")
        (tmp_path / "wide.toml").write_text(WIDE)
    probe = ("from hvd_train.api import resolve_recipe\n"
             "from hvd_train.training.run import open_run\n"
             "import tensorflow as tf; "
             f"recipe = resolve_recipe({recipe!r}, 'tensorflow').with_overrides({overrides!r}); "
             "dist = open_run('tensorflow', recipe, seed=0).dist; "
             "print(f'{tf.config.threading.get_inter_op_parallelism_threads()},"
             "{len(dist.environment.backend.exchange.buckets)}')")  # fmt: skip
    threads, buckets = map(int, probe_output(probe, "HVD_TRAIN_THREADS", "1").split(","))
    assert threads == 1 + spare
    # Decided before the model is built, as the backend then cuts its gradients (overlap
    # aside): more than one bucket, or a Python recipe's model, takes the spare thread.
    assert bool(spare) == (buckets > 1 and overrides.get("overlap") is not False)


@pytest.mark.slow
@pytest.mark.tensorflow
def test_a_later_run_in_the_same_process_trains_on_the_first_runs_threads():
    # TensorFlow fixes its pools at its first op; hvd_train.train called again, with a recipe
    # that would size them otherwise, must still train (it once failed in set_inter_op...).
    probe = ("from hvd_train.api import resolve_recipe\n"
             "from hvd_train.training.run import open_run\n"
             "import tensorflow as tf\n"
             "for name in ('resnet18', 'mnist_cnn'):\n"
             "    open_run('tensorflow', resolve_recipe(name, 'tensorflow'), seed=0)\n"
             "print(tf.config.threading.get_inter_op_parallelism_threads())")  # fmt: skip
    assert probe_output(probe, "HVD_TRAIN_THREADS", "1") == "2"  # resnet18's spare thread


WIDE = """
[data]
dataset = "synthetic"
input_shape = [28, 28, 1]
num_classes = 10

[model]
layers = [
    { type = "flatten" },
    { type = "dense", units = 1024 },
    { type = "relu" },
    { type = "dense", units = 1024 },
    { type = "relu" },
    { type = "dense", units = 10 },
    { type = "softmax" },
]
"""
