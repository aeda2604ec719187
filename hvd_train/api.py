"""The Python API: `train` inside a job (each rank calls it), `launch` to start the ranks.

    import hvd_train
    summary = hvd_train.launch("recipes/examples/mnist_resnet_torch.py", np=2, epochs=1)

One run, in the order the data flows: recipe (+ overrides) -> framework adapter -> data on
every rank, checked to agree -> model, handed to the adapter -> the loop -> checkpoints and
metrics.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from hvd_train import __version__
from hvd_train.adapters import Adapter, create_adapter, use_framework
from hvd_train.checkpoint import Checkpoint, checkpoints, remove_partial
from hvd_train.data import Splits, load_data
from hvd_train.errors import UsageError
from hvd_train.models import build_model
from hvd_train.progress import Position
from hvd_train.recipe import Recipe, load_recipe
from hvd_train.resume import (
    check_same_run,
    read_resume_point,
    resumed_option,
    saved_framework,
    saved_recipe,
)
from hvd_train.trainer import RunOptions, Trainer

DEFAULT_RECIPE, DEFAULT_FRAMEWORK, DEFAULT_SEED = "mnist_cnn", "torch", 42


def train(
    recipe: str | Recipe | None = None,
    framework: str | None = None,
    *,
    output_dir: str | Path | None = None,
    seed: int | None = None,
    data_dir: str | Path | None = None,
    resume: bool = False,
    log_every: int = 50,
    checkpoint_every: int | None = None,
    keep_checkpoints: int = 3,
    limit_steps: int | None = None,
    elastic: bool = False,
    commit_every: int = 10,
    timeline: str | Path | None = None,
    **overrides: Any,
) -> dict[str, Any]:
    """Trains `recipe` (a `Recipe`, or a reference as `--recipe` takes it; mnist_cnn if none)
    on this rank, alone or as one of the ranks horovodrun started; the run's summary (written
    by rank 0). Defaults: framework torch, seed 42.

    `overrides` replace recipe settings by key: `epochs=2`, `learning_rate=0.01`, or any key
    of the recipe's tables (`backward_passes_per_step=2`); the keywords before them are the
    CLI's flags of the same names. With `resume`, the recipe, seed and framework are the
    checkpoint's, and what is given must agree with them but for more epochs. `timeline`
    records Horovod's timeline of the run into that file (rank 0 writes it).
    """
    if resume and output_dir is None:
        raise UsageError("--resume needs --output-dir, the folder of the run to continue")
    if elastic and output_dir is None:
        raise UsageError(
            "--elastic needs --output-dir, a folder that every host sees (a shared file "
            "system), so that whichever worker is rank 0 writes to the same run"
        )
    if resume:
        framework = framework or saved_framework(Path(str(output_dir)))
    framework = framework or DEFAULT_FRAMEWORK
    use_framework(framework)  # before any Python recipe (a new one, or a checkpoint's) loads
    if not resume:  # a new run's mistakes show before Horovod starts
        recipe = with_overrides(resolve_recipe(recipe or DEFAULT_RECIPE, framework), overrides)
        recipe.check_framework(framework)
    adapter = create_adapter(framework)
    if elastic and not adapter.supports_elastic:
        raise UsageError(
            f"--elastic is not available with --framework {framework}: Horovod's elastic "
            "state for TensorFlow targets Keras 2; use --framework torch, or drop --elastic and "
            "rely on --resume"
        )
    if timeline is not None:  # Horovod reads it when it starts; rank 0 writes the file
        os.environ["HOROVOD_TIMELINE"] = str(Path(timeline).resolve())
    adapter.init()
    checkpoint = None
    if resume:
        # Elastic: every rank reads the checkpoint itself (a joining worker runs this too, and
        # must not wait in a collective here); otherwise rank 0 reads and tells the others.
        everywhere = elastic
        checkpoint, state, recipe_text = read_resume_point(
            adapter, Path(str(output_dir)), everywhere
        )
        recipe = resumed_recipe(state, recipe_text, recipe, framework, overrides)
        seed = resumed_option(state, "--seed", seed)
        limit_steps = resumed_option(state, "--limit-steps", limit_steps)
    assert isinstance(recipe, Recipe)
    default_dir = Path("runs", f"{recipe.name}-{framework}-{time.strftime('%Y%m%d-%H%M%S')}")
    options = RunOptions(
        framework=framework,
        # Rank 0's choice of folder: the ranks' clocks may name the default differently.
        output_dir=Path(output_dir or adapter.broadcast_object(default_dir)),
        seed=DEFAULT_SEED if seed is None else seed,
        data_dir=Path(data_dir) if data_dir is not None else None,
        resume=resume,
        log_every=log_every,
        checkpoint_every=checkpoint_every,
        keep_checkpoints=keep_checkpoints,
        limit_steps=limit_steps,
        elastic=elastic,
        commit_every=commit_every,
    )
    return run(adapter, recipe, options, checkpoint)


def resumed_recipe(
    state: dict[str, Any], recipe_text: str, given: str | Recipe | None, framework: str,
    overrides: dict[str, Any],
) -> Recipe:  # fmt: skip
    """The checkpoint's recipe, with `overrides` and `given` (a recipe the user named)
    checked against it: only the safe changes may differ."""
    saved = saved_recipe(state, recipe_text)
    asked = with_overrides(resolve_recipe(given, framework) if given else saved, overrides)
    check_same_run(saved, asked, state["path"])
    asked.check_framework(framework)
    return asked


def resolve_recipe(recipe: str | Recipe, framework: str) -> Recipe:
    """The recipe object; a reference is loaded with Keras set to run on `framework`."""
    use_framework(framework)
    return load_recipe(recipe) if isinstance(recipe, str) else recipe


def with_overrides(recipe: Recipe, overrides: dict[str, Any]) -> Recipe:
    """`recipe` with `overrides` applied; a bad one is named as an override."""
    try:
        return recipe.with_overrides(overrides)
    except UsageError as error:
        raise UsageError(f"override {error}") from None


def run(
    adapter: Adapter, recipe: Recipe, options: RunOptions, checkpoint: Checkpoint | None
) -> dict[str, Any]:
    """One training job on this rank, once Horovod is initialised; `checkpoint` (on rank 0)
    is where a resumed run starts."""
    if options.elastic:
        return run_elastic(adapter, recipe, options, checkpoint)
    data = load_data_on_every_rank(adapter, recipe, options)
    adapter.on_rank_zero(lambda: prepare_output_dir(options.output_dir, options.resume))
    adapter.setup(build_model(recipe, adapter, options.seed), recipe)
    trainer = Trainer(adapter, data, recipe, options)
    start = Position(0, 0)
    if options.resume:
        start = adapter.on_rank_zero(lambda: trainer.load_snapshot(checkpoint))  # type: ignore[arg-type]
    adapter.broadcast_state(include_optimizer=options.resume)
    return trainer.fit(start)


def run_elastic(
    adapter: Adapter, recipe: Recipe, options: RunOptions, checkpoint: Checkpoint | None
) -> dict[str, Any]:
    """`run` under Horovod's elastic driver. Everything before the elastic loop stays on this
    rank: a worker that joins a running job runs it too, while the others wait in the loop,
    and a collective there would never be matched. The job's start (the ranks' agreement, the
    output folder, the resumed position) happens once, inside the loop."""
    data = load_data(recipe, options.data_dir)
    adapter.setup(build_model(recipe, adapter, options.seed), recipe)
    trainer = Trainer(adapter, data, recipe, options)

    def begin() -> Position:
        check_ranks_agree(adapter, None, run_facts(recipe, options, data))
        adapter.on_rank_zero(lambda: prepare_output_dir(options.output_dir, options.resume))
        if not options.resume:
            return Position(0, 0)
        return adapter.on_rank_zero(lambda: trainer.load_snapshot(checkpoint))  # type: ignore[arg-type]

    return trainer.fit_elastic(begin)


def load_data_on_every_rank(adapter: Adapter, recipe: Recipe, options: RunOptions) -> Splits:
    """Loads the data on every rank, then checks that all ranks agree on what they run, so a
    mismatch (or a rank without data) stops the job with a message instead of a hang."""
    data, problem = None, None
    try:
        data = load_data(recipe, options.data_dir)
    except UsageError as error:
        problem = str(error)
    check_ranks_agree(adapter, problem, run_facts(recipe, options, data))
    assert data is not None
    return data


def run_facts(recipe: Recipe, options: RunOptions, data: Splits | None) -> dict[str, Any]:
    """What every rank must run alike."""
    return {
        "hvd_train version": __version__,
        "framework": options.framework,
        "recipe": recipe.recipe_hash(),
        "seed": options.seed,
        "training examples": None if data is None else len(data.train),
        "test examples": None if data is None else len(data.test),
    }


def check_ranks_agree(adapter: Adapter, problem: str | None, facts: dict[str, Any]) -> None:
    """Stops every rank at once if any rank has a `problem` or `facts` that differ from rank
    0's, naming the rank and the difference."""
    everyone = adapter.allgather_object((problem, facts))
    for rank, (rank_problem, rank_facts) in enumerate(everyone):
        if rank_problem is not None:
            raise UsageError(
                f"rank {rank}: {rank_problem}" if adapter.world_size > 1 else rank_problem
            )
        for key, value in rank_facts.items():
            if value != everyone[0][1][key]:
                raise UsageError(
                    f"rank {rank} disagrees with rank 0 on the {key} ({value!r} vs "
                    f"{everyone[0][1][key]!r}); run the same hvd_train, recipe, flags and data "
                    "on every host"
                )


def prepare_output_dir(output_dir: Path, resume: bool) -> None:
    """Creates the run directory and removes what a killed run left half-written; refuses to
    write over an earlier run's checkpoints."""
    try:
        (output_dir / "checkpoints").mkdir(parents=True, exist_ok=True)
        probe = output_dir / f".write-test-{time.time_ns()}"
        probe.touch()
        probe.unlink()
        remove_partial(output_dir / "checkpoints")
    except OSError as error:
        raise UsageError(
            f"cannot write to output directory {output_dir} ({error.strerror}); "
            "choose another --output-dir"
        ) from None
    if not resume and checkpoints(output_dir / "checkpoints"):
        raise UsageError(
            f"{output_dir} already holds checkpoints; pass --resume to continue that run "
            "or choose another --output-dir"
        )


def _train_rank(
    recipe: str | Recipe | None, framework: str | None, options: dict[str, Any]
) -> dict[str, Any]:
    """What `launch` runs in each rank."""
    return train(recipe, framework, **options)


def launch(
    recipe: str | Recipe | None = None,
    np: int = 2,
    framework: str | None = None,
    *,
    hosts: str | None = None,
    **options: Any,
) -> dict[str, Any]:
    """Starts `np` ranks with Horovod's own `horovod.run` (Gloo; on this machine, or on
    `hosts` as horovodrun's -H takes them) and trains `recipe` in each; rank 0's summary.
    `options` are `train`'s keywords and overrides."""
    import horovod

    results = horovod.run(
        _train_rank, args=(recipe, framework, options), np=np, hosts=hosts, use_gloo=True
    )
    summary: dict[str, Any] = results[0]
    return summary
