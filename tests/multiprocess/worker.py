"""Runs inside each rank under `horovodrun -np 2` (or alone, as one rank) and saves what the
tests compare: the weights at each stage, per rank.

usage: worker.py FRAMEWORK RECIPE DATA_DIR OUT_DIR STEPS [KEY=VALUE ...]
With one process it trains on the union of what two ranks would see (batches shaped by the
recipe as given), in one batch per step, with the KEY=VALUE overrides: the reference.
"""

import json
import sys
from pathlib import Path

import numpy as np

from hvd_train.data import load_data, take
from hvd_train.data.sharding import epoch_order, shard_steps
from hvd_train.distributed.frameworks import use_framework
from hvd_train.recipe import load_recipe
from hvd_train.training.run import open_run, start

framework, reference, data_dir, out_dir, steps = sys.argv[1:6]
overrides = dict(item.split("=", 1) for item in sys.argv[6:])
out = Path(out_dir)
use_framework(framework)
layout = load_recipe(reference)  # how two ranks would split the data
recipe = layout.with_overrides({key: json.loads(value) for key, value in overrides.items()})
adapter = start(framework)
run = open_run(adapter, recipe, seed=100 + adapter.rank)  # a different start on each rank
np.savez(out / f"init-{adapter.world_size}-{adapter.rank}.npz", **run.weights())
adapter.broadcast_state(include_optimizer=False)
np.savez(out / f"broadcast-{adapter.world_size}-{adapter.rank}.npz", **run.weights())
# Under torch, the buckets on their way when the pass reaches the model's first parameter.
on_the_way: list[int] = []
exchange = getattr(adapter, "exchange", None)
if exchange is not None:
    exchange.parameters[0].register_post_accumulate_grad_hook(
        lambda _: on_the_way.append(len(exchange.sent))
    )

data = load_data(recipe, Path(data_dir))
order = epoch_order(len(data.train), seed=0, epoch=0)
batch_size, passes = layout.schedule.batch_size, layout.horovod.backward_passes_per_step
shards = [shard_steps(order, rank, 2, batch_size, passes) for rank in range(2)]
for step in range(int(steps)):
    if adapter.world_size == 2:
        batches = shards[adapter.rank][step]
    else:  # one batch holding all of both ranks' batches; or as many passes as they had
        batches = [np.concatenate([*shards[0][step], *shards[1][step]])]
    taken = [take(data.train, batch) for batch in batches]
    adapter.train_step(taken, 0.01, step, np.zeros(2))
np.savez(out / f"trained-{adapter.world_size}-{adapter.rank}.npz", **run.weights())
np.save(out / f"on-the-way-{adapter.world_size}-{adapter.rank}.npy", np.array(on_the_way))
np.savez(out / f"optimizer-{adapter.world_size}-{adapter.rank}.npz", **adapter.state().optimizer)
adapter.sync_buffers()
np.savez(out / f"synced-{adapter.world_size}-{adapter.rank}.npz", **run.weights())
