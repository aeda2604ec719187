"""`hvd-train bench`: how fast a recipe trains, and where a step's time goes.

Run alone or under horovodrun, it times three things on every rank, one after the other:
  1. training steps, exactly as training takes them, split as the summary splits them: T_data
     (the wait for the batches, which the data workers read ahead), T_comp (forward and
     backward passes), T_sync (the wait for the gradient exchange after them: what the passes
     did not hide) and T_other (the update, Python);
  2. the same steps without the exchange, every rank alone but all at once: what the ranks could
     do if the gradients travelled for free. Their summed throughput is the limit, and (1) over
     it the scaling efficiency;
  3. a plain allreduce of tensors shaped like the gradients, with no training around it: the
     bandwidth the exchange could reach.
Sharded (`[horovod] shard`), it times (1) only: (2) and (3) are figures of the unsharded step,
which the same recipe benched with shard = "none" gives.
With links (Gbit/s), it also projects the scaling efficiency at more hosts, one rank each, on
such links, from the step it measured (see `projected_efficiency`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import time
from collections.abc import Iterator
from contextlib import closing
from dataclasses import dataclass
from typing import Any

import numpy as np

from hvd_train.api import DEFAULT_RECIPE, resolve_recipe, with_overrides
from hvd_train.data import Splits, batch_size
from hvd_train.distributed import Distributed, Loader
from hvd_train.errors import UsageError
from hvd_train.recipe import Data, Recipe, load_data
from hvd_train.training.run import open_run, start

ALLREDUCE_REPEATS = 20
PROJECTED_HOSTS = (2, 4, 8, 16, 32, 64)
# The figures of the unsharded step (phases 2 and 3): None where the recipe shards.
UNSHARDED = ("limit_images_per_second", "scaling_efficiency", "plain_allreduce_ms",
             "plain_allreduce_mb_per_s", "local_step_ms")  # fmt: skip


@dataclass(frozen=True)
class RankTimes:
    """One rank's seconds per step, and its examples per step."""

    examples: int
    data: float  # a training step's wait for its batches (T_data)
    compute: float  # a training step's forward and backward passes (T_comp)
    sync: float  # its wait for the exchange (T_sync)
    hide: float  # how long a transfer could hide behind the last pass (T_hide)
    local: float | None  # a step without the exchange, taking its batches included
    allreduce: float | None  # a plain allreduce of the gradients' bytes (None: sharded)


def time_rank(
    dist: Distributed, data: Splits, recipe: Recipe, steps: int, warmup: int
) -> tuple[RankTimes, float]:
    """This rank's times, and the wall time of the training phase (for images/s)."""
    loading = recipe.loading
    loader = dist.loader(data.train, recipe.schedule.batch_size, workers=loading.workers,
                         prefetch=loading.prefetch, transforms=recipe.transforms(),
                         timeout=loading.timeout,
                         passes=recipe.horovod.backward_passes_per_step)  # fmt: skip
    flags = np.zeros(2)

    def phase(exchange: bool) -> tuple[float, np.ndarray, int]:
        """The wall time of the timed steps (with the exchange, or each rank alone), the sums
        of the wait for data and of the step's parts, and a step's examples on this rank."""
        dist.all_reduce(np.zeros(1), op="sum")  # every rank starts the phase together
        started, parts, examples = time.perf_counter(), np.zeros(4), 0
        for index, (waited, taken) in enumerate(_timed_steps(loader, warmup + steps)):
            if index == warmup:
                started, parts = time.perf_counter(), np.zeros(4)
            with contextlib.nullcontext() if exchange else dist.no_sync():
                result = dist.exchange.step(taken, 1e-4, index, flags)
            parts += [waited, result.compute_seconds, result.sync_seconds, result.hide_seconds]
            examples = sum(batch_size(x) for x, _ in taken)
        return time.perf_counter() - started, parts, examples

    wall, (waited, compute, sync, hide), examples = phase(exchange=True)
    local, allreduce = None, None
    if not dist.exchange.sharded:
        local = phase(exchange=False)[0] / steps
        allreduce = time_gradient_allreduce(dist, recipe.horovod.compression)
    per_step = RankTimes(examples, waited / steps, compute / steps, sync / steps,
                         hide / steps, local, allreduce)  # fmt: skip
    return per_step, wall


def _timed_steps(loader: Loader, count: int) -> Iterator[tuple[float, list[Any]]]:
    """`count` steps' batches from the loader, epoch after epoch, each with the seconds the
    step waited for them."""
    epoch = 0
    while count:
        loader.set_epoch(epoch)
        with closing(loader.step_batches()) as batches:
            for _ in range(min(count, len(loader))):
                waiting = time.perf_counter()
                taken = next(batches)
                yield time.perf_counter() - waiting, taken
                count -= 1
        epoch += 1


def time_gradient_allreduce(dist: Distributed, compression: str) -> float:
    """Seconds per allreduce of a tensor of the gradients' size, as they travel (16-bit under
    compression: float16 for both), with no training around it."""
    weights = [a for name, a in dist.exchange.trained_state().items() if name.startswith("weight.")]
    dtype = np.float32 if compression == "none" else np.float16
    flat = dist.exchange.tensor(np.zeros(sum(a.size for a in weights), dtype))
    dist.all_reduce(flat)  # warmed up (and traced, in TensorFlow)
    started = time.perf_counter()
    for _ in range(ALLREDUCE_REPEATS):
        dist.all_reduce(flat)
    return (time.perf_counter() - started) / ALLREDUCE_REPEATS


def report(ranks: list[RankTimes], wall: float, steps: int, gradient_bytes: int) -> dict[str, Any]:
    """The figures for people and tools: the step and its parts on rank 0 (as in the run's
    summary), the limit from every rank, the plain allreduce averaged over the ranks (those
    two None where sharded)."""
    examples = sum(rank.examples for rank in ranks)
    images_per_second = examples * steps / wall
    step_ms = 1000 * wall / steps
    waited, compute, sync = ranks[0].data, ranks[0].compute, ranks[0].sync
    step = {
        "world_size": len(ranks),
        "global_batch": examples,
        "images_per_second": round(images_per_second, 1),
        "step_ms": round(step_ms, 2),
        "t_data_ms": round(1000 * waited, 2),
        "t_comp_ms": round(1000 * compute, 2),
        "t_sync_ms": round(1000 * sync, 2),
        "t_hide_ms": round(1000 * ranks[0].hide, 2),
        "t_other_ms": round(step_ms - 1000 * (waited + compute + sync), 2),
        "gradient_mb": round(gradient_bytes / 1e6, 3),
        "step_exchange_mb_per_s": round(gradient_bytes / 1e6 / sync, 1) if sync > 1e-6 else None,
    }
    measured = [(r.examples, r.local, r.allreduce) for r in ranks
                if r.local is not None and r.allreduce is not None]  # fmt: skip
    if len(measured) < len(ranks):
        return step | dict.fromkeys(UNSHARDED)
    limit = sum(examples / local for examples, local, _ in measured)
    allreduce = float(np.mean([seconds for *_, seconds in measured]))
    return step | {
        "limit_images_per_second": round(limit, 1),
        "scaling_efficiency": round(images_per_second / limit, 3),
        "plain_allreduce_ms": round(1000 * allreduce, 2),
        "plain_allreduce_mb_per_s": round(gradient_bytes / 1e6 / max(allreduce, 1e-9), 1),
        "local_step_ms": round(1000 * examples / limit, 2),  # a step at the limit
    }


def projected_efficiency(figures: dict[str, Any], hosts: int, gbit_per_s: float) -> float:
    """The scaling efficiency at `hosts` hosts of one rank each, joined by links of `gbit_per_s`.

    A ring allreduce makes every rank send (and receive) 2(N-1)/N of the gradients' bytes. The
    step measured here already holds everything else the exchange costs (negotiation, the
    fusion buffer, waiting for the slowest rank) over a link that is next to free (loopback or
    a bridge). Unless the recipe turns overlap off, the gradients travel while the backward
    pass goes on where the link is slow ("auto" takes overlap there), so the bytes' time on the
    link hides behind the pass's last T_hide ms; the rest lengthens the step, set against the
    step without any exchange. Links' latency is left out: microseconds against
    milliseconds."""
    wire_ms = 2 * (hosts - 1) / hosts * figures["gradient_mb"] * 8 / gbit_per_s
    hidden_ms = 0.0 if figures["overlap"] is False else figures["t_hide_ms"]
    return figures["local_step_ms"] / (figures["step_ms"] + max(0.0, wire_ms - hidden_ms))


def projection(figures: dict[str, Any], links: list[float]) -> dict[str, dict[str, float]]:
    """Gbit/s -> hosts -> projected scaling efficiency, as JSON keys."""
    return {
        f"{gbit:g}": {str(n): round(projected_efficiency(figures, n, gbit), 3)
                      for n in PROJECTED_HOSTS}
        for gbit in links
    }  # fmt: skip


def table(figures: dict[str, Any], title: str) -> str:
    f = figures
    if f["world_size"] == 1:
        exchange = "alone, nothing is exchanged"
    elif f["step_exchange_mb_per_s"]:
        exchange = (f"exchanged at {f['step_exchange_mb_per_s']} MB/s as far as the step "
                    "waits for it")  # fmt: skip
    else:
        exchange = "the exchange hides entirely behind the computation"
    projected = [
        f"  projected on {gbit} Gbit/s: " + ", ".join(f"{n} hosts {100 * e:.0f} %"
                                                      for n, e in by_hosts.items())
        for gbit, by_hosts in f.get("projection", {}).items()
    ]  # fmt: skip
    if f["limit_images_per_second"] is None:
        limit = [f'  limit                {"-":>10} (sharded: bench with shard = "none" for the '
                 "limit, the scaling efficiency and a plain allreduce)"]  # fmt: skip
        allreduce = ""
    else:
        limit = [f"  limit                {f['limit_images_per_second']:10.1f} images/s (every "
                 "rank training alone, all at once)",
                 f"  scaling efficiency   {100 * f['scaling_efficiency']:10.1f} %"]  # fmt: skip
        allreduce = (f"; a plain allreduce of them takes {f['plain_allreduce_ms']:.2f} ms "
                     f"({f['plain_allreduce_mb_per_s']} MB/s)")  # fmt: skip
    return "\n".join([
        title,
        f"  images/s             {f['images_per_second']:10.1f}",
        f"  step                 {f['step_ms']:10.2f} ms = T_data {f['t_data_ms']:.2f} + T_comp "
        f"{f['t_comp_ms']:.2f} + T_sync {f['t_sync_ms']:.2f} + T_other {f['t_other_ms']:.2f} "
        "(update, Python)",
        *limit,
        f"  overlap              {'on' if f['overlapped'] else 'off':>10} (setting: "
        f"{json.dumps(f['overlap'])}); T_hide {f['t_hide_ms']:.2f} ms (the last pass after its "
        "first full bucket)",
        f"  gradients            {f['gradient_mb']:10.3f} MB per step; {exchange}{allreduce}",
        *projected,
    ])  # fmt: skip


def bench_recipe(
    reference: str | None, framework: str, overrides: dict[str, Any], synthetic: bool
) -> Recipe:
    """The recipe to time; with `synthetic`, on generated data of its shape."""
    recipe = with_overrides(resolve_recipe(reference or DEFAULT_RECIPE, framework), overrides)
    if synthetic:
        if not isinstance(recipe.data, Data):
            raise UsageError("--synthetic needs a recipe whose data is a Data(...) table")
        fake = Data(
            "synthetic", input_shape=recipe.data.input_shape, num_classes=recipe.data.num_classes
        )
        recipe = dataclasses.replace(recipe, data=fake)
    recipe.check_framework(framework)
    return recipe


def run_bench(
    recipe_reference: str | None,
    framework: str,
    overrides: dict[str, Any],
    steps: int,
    warmup: int,
    synthetic: bool,
    data_dir: Any,
    links: list[float],
) -> dict[str, Any] | None:
    """Times the recipe on this rank (alone or as one of horovodrun's); the figures on rank 0,
    None on the others."""
    recipe = bench_recipe(recipe_reference, framework, overrides, synthetic)
    dist = start(framework, recipe)
    if links and dist.world_size == 1:
        raise UsageError("--links projects from a measured exchange, and alone there is none: "
                         "run bench under horovodrun -np 2 or more")  # fmt: skip
    data = load_data(recipe, data_dir)
    open_run(dist, recipe, seed=0)
    if links and dist.exchange.sharded:
        raise UsageError('--links projects from the unsharded step: bench with --set '
                         'horovod.shard="none" for the projection', every_rank=True)  # fmt: skip
    times, wall = time_rank(dist, data, recipe, steps, warmup)
    ranks = dist.all_gather(times)
    if not dist.is_rank_zero:
        return None
    weights = [a for name, a in dist.exchange.trained_state().items() if name.startswith("weight.")]
    per_value = 4 if recipe.horovod.compression == "none" else 2
    figures = report(ranks, wall, steps, per_value * sum(a.size for a in weights))
    # The recipe's setting, and whether the timed steps overlapped ("auto" decides by then).
    figures["overlap"] = recipe.horovod.overlap
    figures["overlapped"] = dist.exchange.overlapping
    if links:
        figures["projection"] = projection(figures, links)
    threads = dist.threads
    return figures | {"recipe": recipe.name, "framework": framework, "steps": steps,
                      "threads_per_rank": threads}  # fmt: skip
