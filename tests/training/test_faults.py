"""Faults under the real `horovodrun -np 2`: a job killed with SIGKILL resumes (from
`--resume --output-dir` alone) to exactly the weights of an uninterrupted run, a dead worker
ends the job instead of hanging it, and ranks that disagree stop at once."""

import functools
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from hvd_train.distributed.checkpoint_files import checkpoint_name, checkpoints
from tests.conftest import FRAMEWORKS, REPO
from tests.helpers import assert_same_weights, saved_weights
from tests.horovodrun import (
    HOROVODRUN,
    kill_job,
    rank_children,
    script,
    start,
    trainings,
    wait_for,
)

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow, pytest.mark.timeout(900)]
STEPS = 40  # per epoch; two epochs, a checkpoint every 5 steps
EXAMPLES = REPO / "recipes" / "examples"
# The neutral recipe with its batches read ahead by workers and augmented, and Python recipes:
# a torch module, and a Keras model (with batchnorm and dropout, whose numbers each step seeds)
# under each framework. The plain mnist_cnn resumes to the same weights under each framework in
# test_stops.py (stopped by a signal mid-epoch), and takes no path here that these do not.
RESUMABLE = [
    pytest.param(script("mnist_augmented.toml"), "torch", marks=pytest.mark.torch),
    pytest.param(str(EXAMPLES / "mnist_resnet_torch.py"), "torch", marks=pytest.mark.torch),
    pytest.param(str(EXAMPLES / "mnist_resnet_keras.py"), "torch", marks=pytest.mark.torch),
    pytest.param(
        str(EXAMPLES / "mnist_resnet_keras.py"), "tensorflow", marks=pytest.mark.tensorflow
    ),
]

# The recipes that train sharded here, per framework (the others unsharded): each stage's run
# resumes to the uninterrupted one's weights too.
SHARDED = {
    ("mnist_resnet_torch", "torch"): "gradients",
    ("mnist_resnet_keras", "torch"): "optimizer",
    ("mnist_resnet_keras", "tensorflow"): "gradients",
}


@dataclass
class Resumed:
    straight: Path  # the run that was not interrupted
    killed: Path  # the run killed, its newest checkpoint damaged, and resumed
    damaged: Path  # that checkpoint
    printed: str  # what the resumed run printed


@pytest.fixture(scope="module")
def resumed(mnist_dir, tmp_path_factory) -> Callable[[str, str], Resumed]:
    """resumed(RECIPE, FRAMEWORK): RECIPE trained straight, and killed then resumed. Every
    recipe of a framework trains straight in one job, and resumes in another."""

    @functools.cache
    def runs(framework: str) -> dict[str, Resumed]:
        out = tmp_path_factory.mktemp(f"resumed-{framework}")
        recipes = [recipe for recipe, own in (p.values for p in RESUMABLE) if own == framework]
        arguments = {}
        for recipe in recipes:
            # Settings away from the defaults: the resumed run must take them from the
            # checkpoint. The torch example makes its own optimizer (with weight decay): only
            # clipping is a setting.
            own = recipe.endswith("mnist_resnet_torch.py")
            setting = "optimizer.gradient_clip_norm=1.0" if own else "optimizer.weight_decay=0.01"
            arguments[recipe] = ["--recipe", recipe, "--framework", framework,
                                 "--data-dir", str(mnist_dir), "--epochs", "2",
                                 "--limit-steps", str(STEPS), "--checkpoint-every", "5",
                                 "--seed", "7", "--set", setting]  # fmt: skip
            shard = SHARDED.get((Path(recipe).stem, framework))
            if shard:  # each stage resumes too
                arguments[recipe] += ["--set", f'horovod.shard="{shard}"']
        cases = {recipe: out / Path(recipe).stem for recipe in recipes}
        trainings(*[[*arguments[r], "--output-dir", str(cases[r] / "straight")] for r in recipes])
        damaged = {}
        for recipe, case in cases.items():
            killed = case / "killed"
            job = start(*arguments[recipe], "--output-dir", str(killed))
            wait_for((killed / "checkpoints" / checkpoint_name(1, 0)).exists, job)
            kill_job(job)
            assert not (killed / "summary.json").exists(), "the job finished before it was killed"
            # Damage the newest checkpoint too: resuming must notice and fall back.
            damaged[recipe] = checkpoints(killed / "checkpoints")[-1]
            model = damaged[recipe] / "model.safetensors"
            model.write_bytes(model.read_bytes()[:1000])
        # The user types only --resume and the run's folder (and where the data is).
        data = ["--data-dir", str(mnist_dir)]
        printed = trainings(*[["--resume", "--output-dir", str(case / "killed"), *data]
                              for case in cases.values()])  # fmt: skip
        return {recipe: Resumed(case / "straight", case / "killed", damaged[recipe], text)
                for (recipe, case), text in zip(cases.items(), printed, strict=True)}  # fmt: skip

    return lambda recipe, framework: runs(framework)[recipe]


@pytest.mark.parametrize(("recipe", "framework"), RESUMABLE, ids=lambda p: Path(p).stem)
def test_killed_and_resumed_run_matches_the_uninterrupted_one(recipe, framework, resumed):
    run = resumed(recipe, framework)
    said = f"checkpoint {run.damaged} is corrupt (model.safetensors fails its checksum)"
    assert said in run.printed, run.printed
    straight, after = saved_weights(run.straight, 2), saved_weights(run.killed, 2)
    assert len(straight) >= 8
    assert_same_weights(straight, after)


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_a_dead_worker_ends_the_job_within_a_minute(framework, mnist_dir, tmp_path):
    job = start(
        "--framework", framework, "--data-dir", str(mnist_dir), "--output-dir", str(tmp_path)
    )
    wait_for((tmp_path / "metrics.jsonl").exists, job)
    rank_one = next(p for p, rank, command in rank_children(job)
                    if rank == "1" and "hvd_train" in " ".join(command))  # fmt: skip
    rank_one.kill()
    killed_at = time.monotonic()
    output, _ = job.communicate(timeout=120)
    assert time.monotonic() - killed_at < 60
    assert job.returncode == 128 + 9, output
    assert output.splitlines()[-1] == (
        "horovodrun: rank 1 was killed by SIGKILL (out of memory?); the job was stopped"
    )
    assert "hvd-train: error: lost contact with another rank" in output


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_ranks_that_disagree_stop_at_once_naming_the_difference(framework, mnist_dir, tmp_path):
    launcher = tmp_path / "disagree.py"
    launcher.write_text(
        "import os, sys\nfrom hvd_train.cli import main\n"
        "extra = ['--lr', '0.5'] if os.environ['HOROVOD_RANK'] == '1' else []\n"
        "sys.exit(main(sys.argv[1:] + extra))\n"
    )
    arguments = [
        "--framework",
        framework,
        "--data-dir",
        str(mnist_dir),
        "--output-dir",
        str(tmp_path),
    ]
    command = [str(HOROVODRUN), "-np", "2", "--gloo", sys.executable, str(launcher), *arguments]
    started = time.monotonic()
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert time.monotonic() - started < 60
    assert result.returncode != 0
    assert (
        "[0]<stderr>:hvd-train: error: rank 1 disagrees with rank 0 on the recipe"
        in result.stdout + result.stderr
    )
    assert not (tmp_path / "checkpoints").exists()
