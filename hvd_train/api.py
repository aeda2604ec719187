"""The Python API inside a job: `train`, which each rank calls (`launching.launch` starts the
ranks and calls it in each).

    import hvd_train
    summary = hvd_train.train("recipes/examples/mnist_resnet_torch.py", epochs=1)

One run, in the order the data flows: recipe (+ overrides) -> the distributed layer for the
framework -> data on every rank, checked to agree -> model, set up on the layer -> the loop ->
checkpoints and metrics (docs/architecture.md).
"""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path
from typing import Any

from hvd_train.data import Splits
from hvd_train.distributed import Distributed, Found, saved_framework
from hvd_train.errors import UsageError
from hvd_train.frameworks import DEFAULT_FRAMEWORK, import_quietly, use_framework
from hvd_train.recipe import Recipe, is_python_reference, load_data, load_recipe, with_validation
from hvd_train.training.evaluation import check_outputs_fit
from hvd_train.training.metrics import MetricsWriter, write_summary
from hvd_train.training.options import RunOptions
from hvd_train.training.plot import plot_runs
from hvd_train.training.position import Position
from hvd_train.training.resume import check_same_run, resumed_option, saved_recipe
from hvd_train.training.run import Run, open_run, start
from hvd_train.training.trackers import Trackers
from hvd_train.training.trainer import Trainer
from hvd_train.version import __version__

DEFAULT_RECIPE, DEFAULT_SEED = "mnist_cnn", 42


def train(
    recipe: str | Recipe | None = None, framework: str | None = None, **keywords: Any
) -> dict[str, Any]:
    """Trains `recipe` (a `Recipe`, or a reference as `--recipe` takes it; mnist_cnn if none)
    on this rank, alone or as one of the ranks horovodrun started; the run's summary (written
    by rank 0). Defaults: framework DEFAULT_FRAMEWORK (torch), seed 42.

    `keywords` are `RunOptions`'s fields, the CLI's train flags by the same names
    (`output_dir`, `seed`, `resume`, `checkpoint_every`, `horovod_timeline`, ...), and
    overrides of recipe settings by key: `epochs=2`, `learning_rate=0.01`, or any key of the
    recipe's tables (`backward_passes_per_step=2`). With `resume`, the recipe, seed and
    framework are the checkpoint's, and what is given must agree with them but for more epochs.
    """
    options, overrides = RunOptions.split(keywords)
    if options.resume:
        framework = framework or saved_framework(Path(str(options.output_dir)))
    framework = framework or DEFAULT_FRAMEWORK
    use_framework(framework)  # before any Python recipe (a new one, or a checkpoint's) loads
    if not options.resume:
        recipe = new_recipe(recipe, framework, overrides)
    if options.horovod_timeline is not None:  # Horovod reads it as it starts; rank 0 writes it
        os.environ["HOROVOD_TIMELINE"] = str(options.horovod_timeline.resolve())
    dist = start(framework, recipe if isinstance(recipe, Recipe) else None)  # None: resumed
    if options.elastic and dist.exchange.without_elastic:
        raise UsageError(f"--elastic is not available with --framework {framework}: "
                         f"{dist.exchange.without_elastic}")  # fmt: skip
    found = None
    if options.resume:
        found, recipe, options = resumed_run(dist, recipe, options, overrides)
    assert isinstance(recipe, Recipe)
    return train_on_rank(dist, recipe, decided(dist, recipe, options), found)


def new_recipe(recipe: str | Recipe | None, framework: str, overrides: dict[str, Any]) -> Recipe:
    """A new run's recipe (mnist_cnn if none) with `overrides`, checked for `framework`: its
    mistakes show before Horovod starts."""
    checked = with_overrides(resolve_recipe(recipe or DEFAULT_RECIPE, framework), overrides)
    checked.check_framework(framework)
    return checked


def resumed_run(
    dist: Distributed, given: str | Recipe | None, options: RunOptions, overrides: dict[str, Any]
) -> tuple[Found, Recipe, RunOptions]:
    """The checkpoint a resumed run starts from (its tensors on rank 0), its recipe, and its
    options with the checkpoint's seed and step limit. Elastic: every rank reads the checkpoint
    itself (a joining worker runs this too, and must not wait in a collective here); otherwise
    rank 0 reads and tells the others."""
    output_dir = Path(str(options.output_dir))
    found = dist.checkpoints.find(output_dir, which=str(options.resume),
                                  everywhere=options.elastic)  # fmt: skip
    if found is None:
        raise UsageError(
            f"nothing to resume: {output_dir / 'checkpoints'} holds no valid checkpoint; "
            "leave out --resume to start a new run",
            every_rank=not options.elastic,
        )
    recipe = resumed_recipe(found, given, dist.framework, overrides)
    options = dataclasses.replace(
        options,
        seed=resumed_option(found, "--seed", options.seed),
        limit_steps=resumed_option(found, "--limit-steps", options.limit_steps),
    )
    return found, recipe, options


def decided(dist: Distributed, recipe: Recipe, options: RunOptions) -> RunOptions:
    """`options` with the seed and output folder decided: the default folder is rank 0's
    choice, as the ranks' clocks may name it differently."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    default_dir = Path("runs", f"{recipe.name}-{dist.framework}-{stamp}")
    output_dir = options.output_dir or dist.broadcast(default_dir)
    seed = DEFAULT_SEED if options.seed is None else options.seed
    return dataclasses.replace(options, output_dir=output_dir, seed=seed)


def resumed_recipe(
    found: Found, given: str | Recipe | None, framework: str, overrides: dict[str, Any]
) -> Recipe:
    """The checkpoint's recipe, with `overrides` and `given` (a recipe the user named)
    checked against it: only the safe changes may differ."""
    saved = saved_recipe(found)
    asked = with_overrides(resolve_recipe(given, framework) if given else saved, overrides)
    check_same_run(saved, asked, str(found.path))
    asked.check_framework(framework)
    return asked


def resolve_recipe(recipe: str | Recipe, framework: str) -> Recipe:
    """The recipe object; a reference is loaded with Keras set to run on `framework`."""
    use_framework(framework)
    if not isinstance(recipe, str):
        return recipe
    if is_python_reference(recipe):
        import_quietly(framework)  # the recipe's code may import the framework (through Keras)
    return load_recipe(recipe)


def with_overrides(recipe: Recipe, overrides: dict[str, Any]) -> Recipe:
    """`recipe` with `overrides` applied; a bad one is named as an override."""
    try:
        return recipe.with_overrides(overrides)
    except UsageError as error:
        raise UsageError(f"override {error}") from None


def train_on_rank(
    dist: Distributed, recipe: Recipe, options: RunOptions, found: Found | None
) -> dict[str, Any]:
    """One training job on this rank, once Horovod is initialised; `found` is the checkpoint
    a resumed run starts from."""
    trackers = Trackers(tuple(dict.fromkeys(options.track + recipe.output.trackers)))
    if options.elastic:
        summary = train_elastic(dist, recipe, options, found, trackers)
    else:
        data = load_data_on_every_rank(dist, recipe, options)
        dist.checkpoints.prepare(output_dir(options), resume=bool(options.resume))
        run = open_run(dist, recipe, seed(options))
        trainer = new_trainer(run, data, options, trackers)
        begin_at = Position(0, 0) if found is None else trainer.resume(found)
        summary = trainer.fit(begin_at)
    dist.on_rank_zero(lambda: finish(dist, output_dir(options), summary, trackers))
    return summary


def new_trainer(run: Run, data: Splits, options: RunOptions, trackers: Trackers) -> Trainer:
    """A trainer with its records (sent on to `trackers` too), once the model's outputs are
    known to fit the labels."""
    check_outputs_fit(run.dist, run.recipe, data.train)
    metrics = MetricsWriter(output_dir(options), len(data.train), trackers,
                            run.recipe.settings_table())  # fmt: skip
    return Trainer(run, data, options, metrics)


def finish(dist: Distributed, folder: Path, summary: dict[str, Any], trackers: Trackers) -> None:
    """Rank 0 writes summary.json and draws the run's curves.png, which the trackers take, with
    the checkpoint the run keeps."""
    write_summary(folder, summary)
    plot_runs([folder], folder / "curves.png")
    trackers.call("finish", folder, dist.checkpoints.kept(folder))


def train_elastic(
    dist: Distributed, recipe: Recipe, options: RunOptions, found: Found | None,
    trackers: Trackers,
) -> dict[str, Any]:  # fmt: skip
    """`train_on_rank` under Horovod's elastic driver. Everything before the elastic loop
    stays on this rank: a worker that joins a running job runs it too, while the others wait
    in the loop, and a collective there would never be matched. The job's start (the ranks'
    agreement, the output folder, the resumed position) happens once, inside the loop."""
    data = with_validation(load_data(recipe, options.data_dir), recipe, seed(options))
    trainer = new_trainer(open_run(dist, recipe, seed(options)), data, options, trackers)

    def begin() -> Position:
        check_ranks_agree(dist, None, run_facts(dist, recipe, options, data))
        dist.checkpoints.prepare(output_dir(options), resume=bool(options.resume))
        return Position(0, 0) if found is None else trainer.resume(found, broadcast=False)

    return trainer.fit_elastic(begin)


def output_dir(options: RunOptions) -> Path:
    assert options.output_dir is not None, "decided when the run starts"
    return options.output_dir


def seed(options: RunOptions) -> int:
    assert options.seed is not None, "decided when the run starts"
    return options.seed


def load_data_on_every_rank(dist: Distributed, recipe: Recipe, options: RunOptions) -> Splits:
    """Loads the data on every rank, then checks that all ranks agree on what they run, so a
    mismatch (or a rank without data) stops the job with a message instead of a hang."""
    data, problem = None, None
    try:
        data = with_validation(load_data(recipe, options.data_dir), recipe, seed(options))
    except UsageError as error:
        problem = str(error)
    check_ranks_agree(dist, problem, run_facts(dist, recipe, options, data))
    assert data is not None
    return data


def run_facts(
    dist: Distributed, recipe: Recipe, options: RunOptions, data: Splits | None
) -> dict[str, Any]:
    """What every rank must run alike."""
    return {
        "hvd_train version": __version__,
        "framework": dist.framework,
        "recipe": recipe.recipe_hash(),
        "seed": options.seed,
        "training examples": None if data is None else len(data.train),
        "test examples": None if data is None else len(data.test),
        "validation examples": None
        if data is None or not data.validation
        else len(data.validation),
    }


def check_ranks_agree(dist: Distributed, problem: str | None, facts: dict[str, Any]) -> None:
    """Stops every rank at once if any rank has a `problem` or `facts` that differ from rank
    0's, naming the rank and the difference."""
    everyone = dist.all_gather((problem, facts))
    for rank, (rank_problem, rank_facts) in enumerate(everyone):
        if rank_problem is not None:
            raise UsageError(
                f"rank {rank}: {rank_problem}" if dist.world_size > 1 else rank_problem,
                every_rank=True,
            )
        for key, value in rank_facts.items():
            if value != everyone[0][1][key]:
                raise UsageError(
                    f"rank {rank} disagrees with rank 0 on the {key} ({value!r} vs "
                    f"{everyone[0][1][key]!r}); run the same hvd_train, recipe, flags and data "
                    "on every host",
                    every_rank=True,
                )
