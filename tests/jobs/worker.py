"""Runs inside each rank under `horovodrun -np 2` (or alone, as one rank) and saves what the
tests compare: the weights at each stage, per rank.

usage: worker.py FRAMEWORK DATA_DIR RECIPE:STEPS:OUT_DIR [RECIPE:STEPS:OUT_DIR ...] [KEY=VALUE ...]
Each recipe in turn, set up on a layer of its own, takes STEPS steps and writes to its OUT_DIR:
one job serves many cases (its start, the framework's import above all, is most of a short
case's time). With one process it trains on the union of what two ranks would see (batches
shaped by the recipe as given), in one batch per step, with the KEY=VALUE overrides: the
reference.
"""

import json
import sys
from pathlib import Path

import numpy as np

from hvd_train.builders import build_model
from hvd_train.data import take
from hvd_train.data.order import epoch_order, rank_steps
from hvd_train.frameworks import use_framework
from hvd_train.recipe import load_data, load_recipe
from hvd_train.training.run import open_run, start


def case(framework: str, reference: str, data_dir: str, out: Path, steps: int,
         overrides: dict[str, str]) -> None:  # fmt: skip
    out.mkdir(exist_ok=True)
    layout = load_recipe(reference)  # how two ranks would split the data
    recipe = layout.with_overrides({key: json.loads(value) for key, value in overrides.items()})
    dist = start(framework)
    built = build_model(recipe, framework, seed=100 + dist.rank)  # a different start on each rank
    if framework == "torch":
        own = {name: t.detach().numpy() for name, t in built.model.state_dict().items()}
    else:
        from hvd_train.distributed import keras_state

        own = keras_state.weights(built.model)
    np.savez(out / f"init-{dist.world_size}-{dist.rank}.npz", **built.layout.to_saved(own))
    run = open_run(dist, recipe, seed=100 + dist.rank)  # the same build, then rank 0's weights
    np.savez(out / f"broadcast-{dist.world_size}-{dist.rank}.npz", **run.weights())
    # Under torch, the buckets on their way when the pass reaches the model's first parameter.
    on_the_way: list[int] = []
    exchange = getattr(dist.environment.backend, "exchange", None) if framework == "torch" else None
    if exchange is not None:
        exchange.parameters[0].register_post_accumulate_grad_hook(
            lambda _: on_the_way.append(len(exchange.sent))
        )

    data = load_data(recipe, Path(data_dir))
    order = epoch_order(len(data.train), seed=0, epoch=0)
    batch_size, passes = layout.schedule.batch_size, layout.horovod.backward_passes_per_step
    shards = [rank_steps(order, rank, 2, batch_size, passes) for rank in range(2)]
    for step in range(steps):
        if dist.world_size == 2:
            batches = shards[dist.rank][step]
        else:  # one batch holding all of both ranks' batches; or as many passes as they had
            batches = [np.concatenate([*shards[0][step], *shards[1][step]])]
        taken = [take(data.train, batch) for batch in batches]
        dist.exchange.step(taken, 0.01, step, np.zeros(2))
    np.savez(out / f"trained-{dist.world_size}-{dist.rank}.npz", **run.weights())
    np.save(out / f"on-the-way-{dist.world_size}-{dist.rank}.npy", np.array(on_the_way))
    optimizer = dist.exchange.state().optimizer
    np.savez(out / f"optimizer-{dist.world_size}-{dist.rank}.npz", **optimizer)
    dist.exchange.sync_buffers()
    np.savez(out / f"synced-{dist.world_size}-{dist.rank}.npz", **run.weights())


framework, data_dir = sys.argv[1:3]
cases = [a.split(":", 2) for a in sys.argv[3:] if "=" not in a]
overrides = dict(a.split("=", 1) for a in sys.argv[3:] if "=" in a)
use_framework(framework)
for reference, steps, out_dir in cases:
    case(framework, reference, data_dir, Path(out_dir), int(steps), overrides)
