"""A loop of one's own on the layer (`hvd_train.Distributed`) against hvd_train's trainer and
against the same loop on raw Horovod, per framework, at np=2 on mnist_cnn's model and data; and
under torch, the layer's loop against DDP's on a model of about 100 k parameters, whose step
takes a millisecond or so, where a step's fixed costs show.

    python -m benchmarks.own_loop [--steps 300] [--rounds 2] [--json FILE]

The systems take turns, round after round, each as its own horovodrun (or torchrun) job; each
ratio is of images/s within one round, and the best round's is reported (this machine is
noisy). It prints {"torch": {"loop_over_trainer": R, "loop_over_horovod": R,
"small_loop_over_ddp": R, "small_trainer_over_loop": R, ...}, "tensorflow": {...}}, with every
round's figures.

In a rank: python -m benchmarks.own_loop rank SYSTEM FRAMEWORK RECIPE STEPS
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.run import BIN, PYTHON, free_port, machine, run_all

WARMUP = 20
SMALL = str(Path(__file__).with_name("mnist_mlp.toml"))  # 101,770 parameters
TARGETS = {"loop_over_trainer": 0.97, "loop_over_horovod": 1.0, "small_loop_over_ddp": 1.0,
           "small_trainer_over_loop": 0.97}  # fmt: skip


def timed(steps: int, global_batch: int, step: Any, batches: Any) -> float:
    """Images/s over `steps` steps after WARMUP, the loop's own work (taking batches) in it."""
    started = 0.0
    for index, batch in enumerate(batches):
        if index == WARMUP:
            started = time.perf_counter()
        step(*batch)
        if index + 1 == WARMUP + steps:
            break
    return steps * global_batch / (time.perf_counter() - started)


def own_loop(framework: str, recipe: Any, train: Any, steps: int) -> float:
    """The layer's loop, as a user writes it: setup, the loader, backward and step."""
    from hvd_train import Distributed
    from hvd_train.builders import build_model
    from hvd_train.training.run import may_overlap

    # As the trainer decides for the recipe: a model whose gradients fit one bucket never sends
    # during the pass, and TensorFlow then runs no op more at a time than it has cores.
    dist = Distributed(framework, may_overlap=may_overlap(recipe))
    model = build_model(recipe, framework, seed=0).model
    loader = dist.loader(train, recipe.schedule.batch_size)
    global_batch = loader.global_batch
    if framework == "torch":
        import torch
        import torch.nn.functional as F

        model, optimizer = dist.setup(model, torch.optim.Adam(model.parameters(), 1e-3,
                                                              fused=True))  # fmt: skip

        def step(x: Any, y: Any) -> None:
            optimizer.zero_grad()
            dist.backward(F.cross_entropy(model(x), y))
            optimizer.step()

    else:
        import keras
        import tensorflow as tf

        model, optimizer = dist.setup(model, keras.optimizers.Adam(1e-3))
        cross_entropy = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

        @tf.function(reduce_retracing=True)
        def step(x: Any, y: Any) -> None:
            with tf.GradientTape() as tape:
                loss = cross_entropy(y, model(x, training=True))
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))

    return timed(steps, global_batch, step, (batch for epoch in range(9) for batch in
                                             epoch_batches(loader, epoch)))  # fmt: skip


def epoch_batches(loader: Any, epoch: int) -> Any:
    loader.set_epoch(epoch)
    return iter(loader)


def raw_horovod(framework: str, recipe: Any, train: Any, steps: int) -> float:
    """The same loop on Horovod's own API, as its examples write it."""
    from benchmarks.common import batches
    from hvd_train.builders import build_model

    batch = recipe.schedule.batch_size
    if framework == "torch":
        import horovod.torch as hvd
        import torch
        import torch.nn.functional as F

        hvd.init()
        torch.set_num_threads(threads(hvd.local_size()))  # as Horovod's examples pin them
        model = build_model(recipe, framework, seed=0).model
        optimizer = torch.optim.Adam(model.parameters(), 1e-3, fused=True)
        optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)

        def step(x: Any, y: Any) -> None:
            optimizer.zero_grad()
            inputs, labels = torch.from_numpy(x).permute(0, 3, 1, 2), torch.from_numpy(y)
            F.cross_entropy(model(inputs), labels).backward()
            optimizer.step()

    else:
        import horovod.tensorflow as hvd
        import keras
        import tensorflow as tf

        hvd.init()
        tf.config.threading.set_intra_op_parallelism_threads(threads(hvd.local_size()))
        tf.config.threading.set_inter_op_parallelism_threads(threads(hvd.local_size()))
        model = build_model(recipe, framework, seed=0).model
        optimizer = keras.optimizers.Adam(1e-3)
        cross_entropy = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        hvd.broadcast_variables(model.variables, root_rank=0)  # Keras 3's: patch 16

        @tf.function(reduce_retracing=True)
        def step(x: Any, y: Any) -> None:
            with tf.GradientTape() as tape:
                loss = cross_entropy(y, model(x, training=True))
            tape = hvd.DistributedGradientTape(tape)  # Keras 3's variables: patch 16
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))

    count = WARMUP + steps
    return timed(steps, batch * hvd.size(), step,
                 batches(train, batch, hvd.rank(), hvd.size(), count))  # fmt: skip


def threads(ranks_here: int) -> int:
    """A rank's share of the host's cores."""
    return max(1, len(os.sched_getaffinity(0)) // ranks_here)


def trainer(framework: str, recipe_name: str, steps: int) -> float:
    """hvd_train's trainer on the recipe, its loop timed from step WARMUP to its last step by a
    callback (evaluation and start-up outside it)."""
    import hvd_train
    from hvd_train.recipe import load_recipe

    class Clock(hvd_train.Callback):
        def __init__(self) -> None:
            self.times: list[float] = []

        def on_step_end(self, state: hvd_train.State) -> None:
            if state.step in (WARMUP, WARMUP + steps):
                self.times.append(time.perf_counter())

    clock = Clock()
    recipe = dataclasses.replace(load_recipe(recipe_name), callbacks=(clock,))
    with tempfile.TemporaryDirectory() as folder:
        summary = hvd_train.train(recipe, framework, epochs=1, limit_steps=WARMUP + steps,
                                  output_dir=folder, log_every=10**6)  # fmt: skip
    return steps * summary["global_batch_size"] / (clock.times[1] - clock.times[0])


def ddp(recipe_name: str, steps: int) -> float:
    """torch's DistributedDataParallel on Gloo (torchrun), its loop as benchmarks.run's."""
    import torch
    import torch.distributed as dist

    from benchmarks.common import measure, setup
    from benchmarks.torch_baselines import ddp_step

    recipe, train = setup(recipe_name)
    torch.set_num_threads(threads(int(os.environ["LOCAL_WORLD_SIZE"])))  # as hvd_train's ranks
    _, step = ddp_step(recipe, bf16=False)

    rank, world = dist.get_rank(), dist.get_world_size()
    # The group is left to the process's exit: destroying it right after the last barrier
    # aborted a rank now and then ("terminate called without an active exception").
    return measure(step, train, recipe.schedule.batch_size, rank, world, steps, WARMUP,
                   dist.barrier)  # fmt: skip


def in_rank(system: str, framework: str, recipe_name: str, steps: int) -> None:
    from benchmarks.common import setup

    if system == "trainer":
        figure = trainer(framework, recipe_name, steps)
    elif system == "ddp":
        figure = ddp(recipe_name, steps)
    else:
        recipe, train = setup(recipe_name)
        run = own_loop if system == "loop" else raw_horovod
        figure = run(framework, recipe, train, steps)
    if int(os.environ.get("HOROVOD_RANK") or os.environ.get("RANK") or 0) == 0:
        print("RESULT " + json.dumps({"images_per_second": round(figure, 1)}), flush=True)


def job(system: str, framework: str, recipe: str, steps: int) -> list:
    rank = [PYTHON, "-m", "benchmarks.own_loop", "rank", system, framework, recipe, str(steps)]
    if system == "ddp":
        torchrun = [PYTHON, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                    "--master-port", str(free_port())]  # fmt: skip
        return [([*torchrun, *rank[1:]], {})]
    return [([str(BIN / "horovodrun"), "-np", "2", "--gloo", *rank], {})]


ROUND = {  # framework -> (system, recipe) in the order they take turns
    "torch": [("loop", "mnist_cnn"), ("trainer", "mnist_cnn"), ("horovod", "mnist_cnn"),
              ("loop", SMALL), ("ddp", SMALL), ("trainer", SMALL)],
    "tensorflow": [("loop", "mnist_cnn"), ("trainer", "mnist_cnn"), ("horovod", "mnist_cnn")],
}  # fmt: skip


def ratios(figures: dict[str, float]) -> dict[str, float]:
    found = {
        "loop_over_trainer": figures["loop mnist_cnn"] / figures["trainer mnist_cnn"],
        "loop_over_horovod": figures["loop mnist_cnn"] / figures["horovod mnist_cnn"],
    }
    if "ddp small" in figures:
        found["small_loop_over_ddp"] = figures["loop small"] / figures["ddp small"]
        found["small_trainer_over_ddp"] = figures["trainer small"] / figures["ddp small"]
        found["small_trainer_over_loop"] = figures["trainer small"] / figures["loop small"]
    return {name: round(value, 3) for name, value in found.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json", type=Path, help="also write the figures as JSON here")
    args = parser.parse_args()
    rounds: dict[str, list[dict[str, Any]]] = {framework: [] for framework in ROUND}
    for number in range(args.rounds):
        for framework, systems in ROUND.items():
            figures = {}
            for system, recipe in systems:
                name = f"{system} {'small' if recipe == SMALL else recipe}"
                found = run_all(job(system, framework, recipe, args.steps))
                figures[name] = found[0]["images_per_second"]
                print(f"  [{number + 1}/{args.rounds}] {framework} {name}: {figures[name]:.0f} "
                      "images/s", file=sys.stderr, flush=True)  # fmt: skip
            rounds[framework].append({"images_per_second": figures, "ratios": ratios(figures)})
    best = {framework: {name: max(r["ratios"][name] for r in found) for name in found[0]["ratios"]}
            for framework, found in rounds.items()}  # fmt: skip
    print(json.dumps(best))
    if args.json:
        figures = {"machine": machine(), "steps": args.steps, "targets": TARGETS, "best": best,
                   "rounds": rounds}  # fmt: skip
        args.json.write_text(json.dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    if sys.argv[1:2] == ["rank"]:
        in_rank(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]))
    else:
        main()
