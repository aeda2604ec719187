"""TensorFlow traces each of the adapter's graphs once: an epoch's last, smaller batch (or an
evaluation's) runs in the graph the first batch traced, instead of tracing it again (0.9 s)."""

import subprocess
import sys

import pytest

PROBE = """
import sys
from pathlib import Path
import numpy as np
from hvd_train.data import load_data, take
from hvd_train.recipe import load_recipe
from hvd_train.run import open_run

recipe = load_recipe("mnist_cnn").with_overrides({"backward_passes_per_step": 2})
data = load_data(recipe, Path(sys.argv[1]))
adapter = open_run("tensorflow", recipe, seed=0).adapter
for step, size in enumerate([64, 48, 64]):
    batches = [take(data.train, np.arange(size) + 100 * i) for i in range(2)]
    adapter.train_step(batches, 0.001, step, np.zeros(2))
    adapter.local_step(batches, step)
    adapter.eval_batch(*take(data.test, np.arange(size)))
graphs = {"accumulate": adapter._compiled_accumulate, "local": adapter._compiled_local,
          "apply": adapter._compiled_apply[False], "logits": adapter._compiled_logits}
for name, compiled in graphs.items():
    print(name, compiled.graph.experimental_get_tracing_count())
"""


@pytest.mark.tensorflow
def test_each_graph_is_traced_once_whatever_the_batch_size(mnist_dir):
    result = subprocess.run([sys.executable, "-c", PROBE, str(mnist_dir)], capture_output=True,
                            text=True, timeout=300, check=True)  # fmt: skip
    counts = dict(line.split() for line in result.stdout.splitlines())
    assert counts == {"accumulate": "1", "apply": "1", "local": "1", "logits": "1"}
