"""Runs inside each rank under `horovodrun -np 2` (or alone, as one rank) and saves what the
tests compare: the weights at each stage, per rank.

usage: worker.py FRAMEWORK RECIPE DATA_DIR OUT_DIR STEPS
With one process it trains on the union of what two ranks would see, as the reference.
"""

import sys
from pathlib import Path

import numpy as np

from hvd_train.adapters import create_adapter, use_keras_backend
from hvd_train.data import load_data, take
from hvd_train.data.sharding import epoch_order, shard_batches
from hvd_train.models import build_model
from hvd_train.recipe import load_recipe

framework, reference, data_dir, out_dir, steps = sys.argv[1:6]
out = Path(out_dir)
use_keras_backend(framework)
recipe = load_recipe(reference)
adapter = create_adapter(framework)
adapter.init()
adapter.setup(build_model(recipe, adapter, seed=100 + adapter.rank), recipe)  # a different start
np.savez(out / f"init-{adapter.world_size}-{adapter.rank}.npz", **adapter.weights())
adapter.broadcast_state(include_optimizer=False)
np.savez(out / f"broadcast-{adapter.world_size}-{adapter.rank}.npz", **adapter.weights())

data = load_data(recipe, Path(data_dir))
order = epoch_order(len(data.train), seed=0, epoch=0)
batch_size = recipe.schedule.batch_size
shards = [shard_batches(order, rank, 2, batch_size) for rank in range(2)]
for step in range(int(steps)):
    if adapter.world_size == 2:
        batch = shards[adapter.rank][step]
    else:
        batch = np.concatenate([shards[0][step], shards[1][step]])
    adapter.train_step(*take(data.train, batch), 0.01, step)
np.savez(out / f"trained-{adapter.world_size}-{adapter.rank}.npz", **adapter.weights())
np.savez(out / f"optimizer-{adapter.world_size}-{adapter.rank}.npz", **adapter.optimizer_state())
adapter.sync_buffers()
np.savez(out / f"synced-{adapter.world_size}-{adapter.rank}.npz", **adapter.weights())
