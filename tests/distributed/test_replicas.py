"""Under the real `horovodrun -np 2`: rank 0's weights reach every rank, and training on
different data per rank keeps the replicas identical because gradients are averaged."""

import functools
import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import FRAMEWORKS
from tests.horovodrun import alone, horovodrun, script

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(900)]

MNIST_CNN = Path(__file__).resolve().parents[2] / "recipes" / "mnist_cnn.toml"


def load(path: Path) -> dict[str, np.ndarray]:
    with np.load(path) as archive:
        return dict(archive)


def assert_same(a: dict, b: dict, atol: float = 0.0) -> None:
    assert a.keys() == b.keys()
    for name in a:
        np.testing.assert_allclose(a[name], b[name], atol=atol, rtol=0, err_msg=name)


def differ(a: dict, b: dict) -> bool:
    return any(not np.array_equal(a[name], b[name]) for name in a)


def with_options(tmp_path: Path) -> str:
    """mnist_cnn with every gradient option on: fp16 allreduce, two backward passes per step,
    clipping, and AdamW's weight decay."""
    text = MNIST_CNN.read_text().replace('name = "adam"', 'name = "adamw"')
    for old, new in [
        ("weight_decay = 0.0", "weight_decay = 0.01"),
        ("gradient_clip_norm = 0.0", "gradient_clip_norm = 0.5"),
        ('compression = "none"', 'compression = "fp16"'),
        ("backward_passes_per_step = 1", "backward_passes_per_step = 2"),
    ]:
        assert old in text
        text = text.replace(old, new)
    path = tmp_path / "options.toml"
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize("framework", FRAMEWORKS)
@pytest.mark.parametrize("options", [False, True], ids=["defaults", "all-options"])
def test_broadcast_then_steps_on_different_data_keep_replicas_identical(framework, options, cases):
    out = cases(framework) / ("all-options" if options else "defaults")
    init = [load(out / f"init-2-{rank}.npz") for rank in range(2)]
    broadcast = [load(out / f"broadcast-2-{rank}.npz") for rank in range(2)]
    trained = [load(out / f"trained-2-{rank}.npz") for rank in range(2)]
    optimizer = [load(out / f"optimizer-2-{rank}.npz") for rank in range(2)]
    assert differ(init[0], init[1]), "ranks should start from different weights"
    assert_same(broadcast[0], init[0])
    assert_same(broadcast[1], init[0])
    assert differ(trained[0], broadcast[0]), "five steps should change the weights"
    assert_same(trained[0], trained[1])
    assert optimizer[0] and optimizer[0].keys() == optimizer[1].keys()
    assert_same(optimizer[0], optimizer[1])


# Variants of plain SGD (no dropout) on 64 images a step: two ranks of 32 (or two passes of 16
# each) must take the step one process takes on all 64 at once, if and only if the gradients
# are averaged (and clipped, compressed, accumulated, sent in buckets during the backward pass)
# as they should be. fp16 and bf16 round (bf16 more). With a dense layer of 16 MB the gradients
# fill two buckets.
STEP_VARIANTS = {
    "sgd": ({}, 1e-6),
    "overlap": ({"units = 128": "units = 4096", 'overlap = "auto"': "overlap = true"}, 1e-6),
    "clipped": ({"gradient_clip_norm = 0.0": "gradient_clip_norm = 0.05"}, 1e-6),
    "accumulated": ({"batch_size = 32": "batch_size = 16",
                     "backward_passes_per_step = 1": "backward_passes_per_step = 2"}, 1e-6),
    "fp16": ({'compression = "none"': 'compression = "fp16"'}, 2e-6),
    "bf16": ({'compression = "none"': 'compression = "bf16"'}, 2e-5),
}  # fmt: skip


def step_variant(variant: str, folder: Path) -> Path:
    text = MNIST_CNN.read_text().replace('name = "adam"', 'name = "sgd"')
    text = text.replace("rate = 0.5", "rate = 0.0").replace("batch_size = 64", "batch_size = 32")
    for old, new in STEP_VARIANTS[variant][0].items():
        assert old in text
        text = text.replace(old, new)
    recipe = folder / f"{variant}.toml"
    recipe.write_text(text)
    return recipe


@pytest.fixture(scope="session")
def cases(mnist_dir, tmp_path_factory) -> Callable[[str], Path]:
    """Every case of this file under one framework in one `horovodrun -np 2` job, and the step
    variants' one-process references in one process (each case set up on a layer of its own,
    writing to a folder named after it): once per framework per session."""

    @functools.cache
    def run(framework: str) -> Path:
        base = tmp_path_factory.mktemp(f"replicas-{framework}")
        variants = [f"{step_variant(v, base)}:2:{base / v}" for v in STEP_VARIANTS]
        two_ranks = [f"mnist_cnn:6:{base / 'defaults'}",
                     f"{with_options(base)}:6:{base / 'all-options'}",
                     f"mnist_bn:3:{base / 'batchnorm'}", *variants]  # fmt: skip
        horovodrun(script("worker.py"), framework, str(mnist_dir), *two_ranks)
        # The reference: all 64 images in one batch, one pass, no compression.
        alone(script("worker.py"), framework, str(mnist_dir), *variants,
              "backward_passes_per_step=1", 'compression="none"')  # fmt: skip
        return base

    return run


@pytest.mark.parametrize("framework", FRAMEWORKS)
@pytest.mark.parametrize("variant", STEP_VARIANTS)
def test_two_ranks_take_the_step_one_process_takes_on_both_batches(framework, variant, cases):
    tolerance = STEP_VARIANTS[variant][1]
    out = cases(framework) / variant
    start = load(out / "broadcast-1-0.npz")
    assert_same(load(out / "broadcast-2-0.npz"), start)
    reference = load(out / "trained-1-0.npz")
    assert differ(reference, start)
    for rank in range(2):
        assert_same(load(out / f"trained-2-{rank}.npz"), reference, atol=tolerance)
    if framework == "torch":  # the first bucket left while the pass went on, the last after it
        on_the_way = np.load(out / "on-the-way-2-0.npy")
        if variant == "overlap":
            assert list(on_the_way) == [1, 1]
        else:
            assert not on_the_way.any()


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_batchnorm_statistics_stay_local_until_rank_zeros_are_handed_out(framework, cases):
    # As under torch's DDP: each rank's running statistics follow its own batches, and before
    # evaluating every rank takes rank 0's, so all ranks evaluate the same model.
    out = cases(framework) / "batchnorm"
    trained = [load(out / f"trained-2-{rank}.npz") for rank in range(2)]
    synced = [load(out / f"synced-2-{rank}.npz") for rank in range(2)]
    running = [name for name in trained[0] if "moving" in name]
    assert len(running) == 10
    for name in trained[0]:
        if name in running:
            assert not np.array_equal(trained[0][name], trained[1][name]), name
        else:
            assert np.array_equal(trained[0][name], trained[1][name]), name
    assert_same(synced[0], trained[0])
    assert_same(synced[1], trained[0])


@pytest.mark.torch
@pytest.mark.parametrize(
    ("ranks", "travel", "overlap"),
    [(2, "none", False), (2, "none", True), (3, "none", False), (2, "bf16", True)],
)
def test_gradients_averaged_in_place_match_the_grouped_exchange_bit_for_bit(ranks, travel, overlap):
    """The same sums in the same order. Gloo's ring (np=3) cuts the buffer by its length, so
    there the overlap, whose buckets Horovod may reduce apart or together, is left out."""
    exchange = script("exchange_bits.py")
    result = horovodrun(exchange, travel, str(int(overlap)), ranks=ranks)
    record = json.loads(result.stdout.split("EXCHANGE ", 1)[1].splitlines()[0])
    assert record["buckets"] > 1 and record["views"], record
    assert record["differing"] == []
    assert record["control"] and record["carried"] == (travel == "none")
