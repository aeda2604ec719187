"""The own-loop layer under the real `horovodrun -np 2` and `hvd_train.launch`: the ports of
Horovod's own MNIST examples (recipes/examples/own_loop_*.py) learn (in whole epochs, as the
README runs them, in tests/test_readme.py), write checkpoints that `hvd-train eval` scores and
`export` writes, and, killed and resumed, end with the weights of the run that was not; a loop
with a scheduler, resumed, ends as the one that ran on; and each mistake with the layer is one
line and exit code 2, with nothing written half (those any one rank makes, in one process)."""

import functools
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from hvd_train.distributed.checkpoint_files import checkpoint_name, checkpoints
from tests.conftest import FRAMEWORKS, REPO
from tests.helpers import assert_same_weights, evaluation, hvd_train, saved_weights
from tests.horovodrun import (
    HOROVODRUN,
    TIMEOUT,
    alone,
    background,
    horovodrun,
    kill_job,
    script,
    wait_for,
)

EXAMPLES = REPO / "recipes" / "examples"
EXPORTS = {"torch": "torch", "tensorflow": "keras"}
PORT_STEPS = {"torch": "100", "tensorflow": "30"}


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_the_port_learns_scores_and_resumes_to_the_same_weights(framework, mnist_dir, tmp_path):
    example = str(EXAMPLES / f"own_loop_{framework}.py")
    # Part of an epoch (tests/test_readme.py runs the ports' whole epochs, to 98.5%): the
    # steps each port takes to 94% and more (TensorFlow's model, Horovod's own, is the larger).
    steps = PORT_STEPS[framework]
    arguments = [example, "--epochs", "2", "--limit-steps", steps, "--data-dir", str(mnist_dir)]
    straight = tmp_path / "straight"
    output = horovodrun(*arguments, "--output-dir", str(straight)).stdout
    accuracy = float(re.findall(r"\[0\]<stdout>:epoch 2: test .*accuracy ([\d.]+)%", output)[-1])
    assert accuracy >= 94, output
    scored = evaluation(straight, "--framework", framework, "--data-dir", str(mnist_dir))
    assert scored["test_accuracy"] == pytest.approx(accuracy / 100, abs=5e-5)
    exported = hvd_train("export", str(straight), "--format", EXPORTS[framework], "--data-dir",
                         str(mnist_dir))  # fmt: skip
    assert exported.returncode == 0, exported.stderr

    killed = tmp_path / "killed"
    command = [str(HOROVODRUN), "-np", "2", "--gloo", sys.executable, *arguments]
    job = background([*command, "--output-dir", str(killed)])
    wait_for((killed / "checkpoints" / checkpoint_name(1, 0)).exists, job)
    kill_job(job)
    assert checkpoints(killed / "checkpoints")[-1].name == checkpoint_name(1, 0)
    alone(*arguments, "--output-dir", str(killed), "--resume", "--np", "2")  # through launch
    for kept in ("model.safetensors", "optimizer.safetensors"):
        assert_same_weights(
            saved_weights(straight, 2, kept=kept), saved_weights(killed, 2, kept=kept)
        )


# Each mistake with the layer, and the world it needs: a mistake any one rank makes shows in one
# process (world size 1); one between ranks, under `horovodrun -np 2`, where it is still said
# once.
MISTAKES = {
    "step-before-setup": (1, "backward needs the model: call dist.setup(model, optimizer) first"),
    "setup-twice": (1, "setup: called a second time"),
    "all-reduce-a-string": (1, "all_reduce: 'done' is not a number; give numbers"),
    "models-differ": (2, "setup: rank 1's model differs from rank 0's"),
    "other-frameworks-optimizer": (1, "setup: the optimizer is a"),
    "load-another-model": (1, "was written for another model"),
    "save-other-values": (2, "save: rank 1 saves other values than rank 0"),
    # torch: LBFGS, which holds its parameters outside its groups; TensorFlow: an optimizer that
    # clips by its own global_clipnorm, which would see this rank's part only.
    "shard-unshardable": (2, 'shard = "optimizer"'),
}


@pytest.mark.slow
@pytest.mark.parametrize("framework", FRAMEWORKS)
@pytest.mark.parametrize(
    "mistake",
    [pytest.param(m, marks=pytest.mark.multiprocess if ranks == 2 else ())
     for m, (ranks, _) in MISTAKES.items()],
)  # fmt: skip
def test_a_mistake_with_the_layer_is_one_line_and_exit_2(mistake, framework, tmp_path):
    said_in_one_line(mistake, framework, tmp_path, *MISTAKES[mistake])


# A torch loop's step out of its place, as Horovod refuses it: a second backward pass outside
# no_sync, sharded or not; and, sharded, where each bucket's pieces are updated as their averages
# arrive in the backward pass, what changes between it and the step, or a pass with no step.
TORCH_MISTAKES = {
    "backward-twice": (1, "backward: pass 2 of a step that takes 1: its gradients would join"),
    "backward-twice-sharded": (2, "backward: pass 2 of a step that takes 1"),
    "rate-after-backward": (2, "the optimizer's lr changed between the backward pass and step()"),
    "zero-grad-before-step": (
        2,
        "optimizer.zero_grad() came between a backward pass and its step()",
    ),
}


@pytest.mark.torch
@pytest.mark.parametrize(
    "mistake",
    [pytest.param(m, marks=pytest.mark.multiprocess if ranks == 2 else ())
     for m, (ranks, _) in TORCH_MISTAKES.items()],
)  # fmt: skip
def test_a_torch_loop_s_step_out_of_its_place_is_one_line_and_exit_2(mistake, tmp_path):
    said_in_one_line(mistake, "torch", tmp_path, *TORCH_MISTAKES[mistake])


def said_in_one_line(mistake: str, framework: str, tmp_path: Path, ranks: int,
                     message: str) -> None:  # fmt: skip
    """own_loop_mistakes.py MISTAKE, alone or at np=2: one line saying `message`, exit code 2,
    nothing written."""
    if mistake == "load-another-model":
        alone(script("own_loop_mistakes.py"), "save", framework, str(tmp_path))
    saved = sorted(tmp_path.rglob("*"))
    job = [str(HOROVODRUN), "-np", "2", "--gloo"] if ranks == 2 else []
    command = [*job, sys.executable, script("own_loop_mistakes.py"), mistake, framework,
               str(tmp_path)]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT)
    output = result.stdout + result.stderr
    assert result.returncode == 2 and "Traceback" not in output, output
    lines = [line for line in output.splitlines() if "hvd-train: error:" in line]
    assert len(lines) == 1 and message in lines[0], output
    assert sorted(tmp_path.rglob("*")) == saved, "something was written"


STEPPING = {
    "torch": ["plain", "module-zero-grad", "no_sync", "passes", "buckets", "bf16", "fp16-mixed"],
    "tensorflow": ["plain", "passes", "fit", "bf16"],
}
# How close two ranks come to one process: the same sums in another order (bf16's and fp16's
# roundings aside).
TOLERANCE = {"bf16": 2e-2, "fp16-mixed": 2e-2}


@pytest.fixture(scope="session")
def stepped(tmp_path_factory) -> Callable[[str], Path]:
    """Every variant of a framework at two ranks in one job, and their references in one
    process: once per framework per session."""

    @functools.cache
    def run(framework: str) -> Path:
        out = tmp_path_factory.mktemp(f"steps-{framework}")
        arguments = (script("own_loop_steps.py"), framework, str(out), *STEPPING[framework])
        horovodrun(*arguments)
        alone(*arguments)
        return out

    return run


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.parametrize(
    ("framework", "variant"), [(f, v) for f in ("torch", "tensorflow") for v in STEPPING[f]]
)
def test_two_ranks_step_as_one_process_on_both_halves(framework, variant, stepped):
    """The loop's own steps through the layer (the optimizer's step, accumulation, buckets while
    the pass goes on, compression, mixed precision, a scheduler made before setup, model.fit)
    at two ranks against one process taking both ranks' batches; the replicas alike."""
    out = stepped(framework)
    two, one = (np.load(out / f"{variant}-{world}.npz") for world in (2, 1))
    assert sorted(two) == sorted(one)
    tolerance = TOLERANCE.get(variant, 1e-5)
    for name in one:
        np.testing.assert_allclose(two[name], one[name], rtol=tolerance, atol=tolerance,
                                   err_msg=name)  # fmt: skip
    if "learning_rate" in one:  # StepLR, made before setup, still steps the optimizer's rate
        assert float(one["learning_rate"]) == pytest.approx(0.1 * 0.5**4)


@pytest.mark.multiprocess
@pytest.mark.slow
def test_the_lamb_loop_learns_through_its_one_cycle(mnist_dir):
    """LAMB with its groups, torch's OneCycleLR made before setup, two batches a step under
    no_sync, bf16 on the wire: it learns, and the rate ends the cycle near 0."""
    output = horovodrun(str(EXAMPLES / "own_loop_lamb.py"), "--epochs", "1", "--limit-steps",
                        "200", "--data-dir", str(mnist_dir)).stdout  # fmt: skip
    assert float(re.findall(r"\[0\]<stdout>:test accuracy ([\d.]+)%", output)[-1]) >= 95, output
    assert float(re.findall(r"learning rate ([\d.e+-]+)", output)[-1]) < 1e-4, output


@pytest.mark.multiprocess
@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_a_loop_with_a_scheduler_resumes_to_the_uninterrupted_weights(framework, tmp_path):
    """A scheduled loop saved after its first epoch and resumed for its second ends as the loop
    that ran both: torch's StepLR reads the rate `dist.load` gave each group back (the groups'
    settings), Keras's schedule the optimizer's step count."""
    horovodrun(script("own_loop_scheduled.py"), framework, str(tmp_path))
    for kept in ("model.safetensors", "optimizer.safetensors"):
        assert_same_weights(saved_weights(tmp_path / "straight", 2, kept=kept),
                            saved_weights(tmp_path / "resumed", 2, kept=kept))  # fmt: skip
