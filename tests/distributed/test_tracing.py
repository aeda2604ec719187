"""TensorFlow traces each of the backend's graphs once: an epoch's last, smaller batch (or an
evaluation's) runs in the graph the first batch traced, instead of tracing it again (0.9 s); so
does a batch of sequences padded to another length."""

import os
import subprocess
import sys

import pytest

from tests.conftest import REPO

# Each test starts a backend in a process of its own: make test runs them, test-quick not.
pytestmark = pytest.mark.slow

PROBE = """
import sys
from pathlib import Path
import numpy as np
from hvd_train.data import take
from hvd_train.recipe import load_data
from hvd_train.recipe import load_recipe
from hvd_train.training.run import open_run

recipe = load_recipe(sys.argv[2]).with_overrides({"backward_passes_per_step": 2})
data = load_data(recipe, Path(sys.argv[1]))
dist = open_run("tensorflow", recipe, seed=0).dist
for step, size in enumerate(map(int, sys.argv[3].split(","))):
    batches = [take(data.train, np.arange(size) + 100 * i + 10 * step) for i in range(2)]
    dist.exchange.step(batches, 0.001, step, np.zeros(2))
    with dist.no_sync():
        dist.exchange.step(batches, 0.001, step, np.zeros(2))
    dist.exchange.eval_batch(*take(data.test, np.arange(size)))
    if isinstance(batches[0][0], dict):
        print("lengths", batches[0][0]["tokens"].shape[1])
backend = dist.environment.backend
graphs = {"accumulate": backend._compiled_accumulate, "local": backend._compiled_local,
          "apply": backend._compiled_apply[False], "logits": backend._compiled_logits}
for name, compiled in graphs.items():
    print(name, compiled.graph.experimental_get_tracing_count())
"""


@pytest.mark.tensorflow
@pytest.mark.parametrize(
    ("recipe", "sizes"),
    [("mnist_cnn", "64,48,64"), (str(REPO / "recipes/examples/text_parquet.py"), "4,3,4")],
)
def test_each_graph_is_traced_once_whatever_the_batch_size(recipe, sizes, mnist_dir, tmp_path):
    environment = os.environ | {"HVD_TRAIN_CACHE": str(tmp_path)}
    result = subprocess.run([sys.executable, "-c", PROBE, str(mnist_dir), recipe, sizes],
                            capture_output=True, text=True, timeout=300, check=True,
                            env=environment)  # fmt: skip
    lines = [line.split() for line in result.stdout.splitlines()]
    if "text" in recipe:  # the batches' texts were padded to lengths of their own
        assert len({length for name, length in lines if name == "lengths"}) == 3
    counts = dict(line for line in lines if line[0] != "lengths")
    assert counts == {"accumulate": "1", "apply": "1", "local": "1", "logits": "1"}
