"""`launch`: start the ranks from Python and train in each (a recipe, or a loop of one's own),
with Horovod's own launcher or as Ray actors; a recipe and its options are checked here first,
and a failure in the ranks comes back as one exception.

    import hvd_train
    summary = hvd_train.launch("mnist_cnn", np=2, epochs=1)
    summary = hvd_train.launch("mnist_cnn", np=2, backend="ray")  # a local Ray cluster
    result = hvd_train.launch(main, np=2, epochs=2)  # main(epochs=2) in each rank
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from hvd_train.api import DEFAULT_FRAMEWORK, new_recipe, train
from hvd_train.errors import UsageError
from hvd_train.recipe import Recipe
from hvd_train.training.options import RunOptions

BACKENDS = ("horovod", "ray")
# What the ranks inherit from the caller where the launcher starts them afresh (Ray's actors):
# Horovod's settings and hvd_train's own.
INHERITED_PREFIXES = ("HOROVOD_", "HVD_TRAIN_")


def launch(
    recipe: str | Recipe | Callable[..., Any] | None = None,
    np: int = 2,
    framework: str | None = None,
    *,
    backend: str = "horovod",
    hosts: str | None = None,
    address: str | None = None,
    **keywords: Any,
) -> Any:
    """Starts `np` ranks, trains `recipe` in each and returns rank 0's summary. `keywords` are
    `train`'s. Where `recipe` is a function instead (a loop of one's own, on `Distributed`),
    each rank calls it with `keywords`, and rank 0's result comes back (`framework` is the
    function's own to choose).

    `backend="horovod"`: Horovod's own `horovod.run`, on Gloo, on this machine or on `hosts`
    as horovodrun's -H takes them. `backend="ray"`: the ranks are Ray actors, started by
    Horovod's `RayExecutor` on the Ray cluster at `address` (None: a local one, started here
    and stopped after).

    The options and a new run's recipe are checked here, before any rank starts: a mistake is
    a `UsageError` with the CLI's one-line message. A failure inside the ranks is raised here
    once, as the first rank to fail raised it; a `UsageError` stays one."""
    if backend not in BACKENDS:
        raise UsageError(f"backend: unknown value {backend!r}; choose one of {', '.join(BACKENDS)}")
    if (backend == "ray" and hosts) or (backend == "horovod" and address):
        given = "hosts" if hosts else "address"
        raise UsageError(
            f"{given} does not apply to backend {backend!r}: hosts are for 'horovod' (as "
            "horovodrun -H), address for 'ray' (the cluster to join); leave it out"
        )
    if not (isinstance(np, int) and np > 0):
        raise UsageError(f"np: expected a positive number of ranks, got {np!r}")
    if callable(recipe) and not isinstance(recipe, Recipe):
        return run_ranks(backend, np, hosts, address, (_call_rank, recipe, keywords))[0]
    options, overrides = RunOptions.split(keywords)
    if not options.resume:
        new_recipe(recipe, framework or DEFAULT_FRAMEWORK, overrides)
    if options.output_dir is not None:  # the ranks' working folder may not be the caller's
        keywords = keywords | {"output_dir": Path(options.output_dir).resolve()}
    summary: dict[str, Any] = run_ranks(backend, np, hosts, address,
                                        (_train_rank, recipe, framework, keywords))[0]  # fmt: skip
    return summary


def _train_rank(
    recipe: str | Recipe | None, framework: str | None, keywords: dict[str, Any]
) -> dict[str, Any]:
    """What `launch` runs in each rank to train a recipe."""
    return train(recipe, framework, **keywords)


def _call_rank(function: Callable[..., Any], keywords: dict[str, Any]) -> Any:
    """What `launch` runs in each rank for a function."""
    return function(**keywords)


def run_ranks(backend: str, np: int, hosts: str | None, address: str | None,
              call: tuple[Any, ...]) -> list[Any]:  # fmt: skip
    """`call[0](*call[1:])` in each of `np` ranks; each rank's result. A UsageError of a rank
    is raised as one line."""
    try:
        if backend == "ray":
            return run_on_ray(np, address, call)
        return run_with_horovod(np, hosts, call)
    except UsageError as error:  # its rank's traceback, in a note, would only hide the line
        raise UsageError(str(error)) from None


def run_with_horovod(np: int, hosts: str | None, call: tuple[Any, ...]) -> list[Any]:
    """`call[0](*call[1:])` in `np` ranks that `horovod.run` starts; each rank's result.
    The patched `horovod.run` raises the exception of the first rank to fail, or a `JobFailed`
    naming it where it cannot be rebuilt here (or where a rank died without one)."""
    import horovod

    with main_script_hidden():
        results: list[Any] = horovod.run(call[0], args=call[1:], np=np, hosts=hosts,
                                         use_gloo=True)  # fmt: skip
    return results


@contextmanager
def main_script_hidden() -> Iterator[None]:
    """Keeps the caller's script from running again in the processes the launcher starts:
    Python's multiprocessing starts them by importing the main script, so a script without an
    `if __name__ == "__main__":` guard would call `launch` again in each. Nothing the ranks
    need comes from it: `launch` sends them the recipe by value."""
    main = sys.modules["__main__"]
    file, spec = main.__dict__.pop("__file__", None), getattr(main, "__spec__", None)
    main.__spec__ = None
    try:
        yield
    finally:
        main.__spec__ = spec
        if file is not None:
            main.__file__ = file


def run_on_ray(np: int, address: str | None, call: tuple[Any, ...]) -> list[Any]:
    """`call[0](*call[1:])` in `np` Ray actors that Horovod's `RayExecutor` starts, one
    CPU each (and one GPU each where the cluster has them); each rank's result. A rank's
    exception is raised as itself, rank 0's first."""
    ray, executor_class = import_ray()
    started_here = not ray.is_initialized()
    if started_here:
        ray.init(address=address, include_dashboard=False, log_to_driver=True)
    try:
        gpus = ray.cluster_resources().get("GPU", 0) >= np
        executor = executor_class(executor_class.create_settings(timeout_s=120),
                                  num_workers=np, cpus_per_worker=1, use_gpu=gpus)  # fmt: skip
        inherited = {k: v for k, v in os.environ.items() if k.startswith(INHERITED_PREFIXES)}
        executor.start(extra_env_vars=inherited)
        try:
            results: list[Any] = executor.run(call[0], args=list(call[1:]))
        except ray.exceptions.RayTaskError as error:
            raise error.cause from None
        finally:
            executor.shutdown()
        return results
    finally:
        if started_here:
            ray.shutdown()


def import_ray() -> tuple[Any, Any]:
    """Ray and Horovod's `RayExecutor`, or a UsageError saying how to install Ray."""
    try:
        import ray
        from horovod.ray import RayExecutor
    except ImportError as error:
        raise UsageError(
            f"backend 'ray' needs Ray ({error}); install it with pip install 'ray==2.60.0'"
        ) from None
    return ray, RayExecutor
