"""How hvd_train shards the training state (`[horovod] shard`).

How a run cuts the buckets among the ranks (`Partition`): every element of every
bucket held by one rank; element-wise cuts near the even ones, on multiples of 64 elements into
their parameter; whole-tensor cuts at parameters' edges only (inside those too large to hold
whole, where asked), evening out what each rank holds over all the buckets, and buckets joined
until their cuts come near even, where asked.

`shard` under the real horovodrun, per framework: each stage's steps against the unsharded
ones of the same job (sharded_steps.py), bit for bit at np=2 for element-wise optimizers and for
LAMB, which each rank updates whole tensors of; within float32 rounding where the gradients'
norm is summed in other orders (clipping) or three ranks' sums are (np=3). Each rank holds its
part only. A parameter no step reaches is skipped, as one process skips it. The trainer's
checkpoints of each stage are the unsharded run's, and resume at np=3 unsharded as sharded
(within rounding under TensorFlow, whose stages both reduce-scatter)."""

import json
import math
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import FRAMEWORKS
from tests.helpers import assert_same_weights, saved_weights
from tests.horovodrun import HOROVODRUN, alone, horovodrun, script, trainings
from tests.training.test_elastic import elastic_job

pytestmark = pytest.mark.timeout(600)


# How the buckets are cut among the ranks, in this process.
SIZES = [9, 1000, 130, 70_000, 5, 4096]
BUCKETS = [[5, 4, 3], [2, 1, 0]]


def partition(ranks: int, whole: bool, split: frozenset[int] = frozenset(), join: bool = False):
    from hvd_train.distributed.sharding import Partition

    return Partition(SIZES, BUCKETS, ranks, whole, split, join)


@pytest.mark.parametrize("whole", [False, True, "split", "joined"])
@pytest.mark.parametrize("ranks", [1, 2, 3, 8])
def test_every_element_is_held_by_one_rank_once(ranks, whole):
    from hvd_train.distributed.sharding import too_large

    split = too_large(SIZES, ranks) if whole in ("split", "joined") else frozenset()
    cut = partition(ranks, bool(whole), split, join=whole == "joined")
    for bucket, indices in enumerate(cut.buckets):
        held = {index: [] for index in indices}
        for rank in range(ranks):
            at = cut.cuts[bucket][rank]
            for piece in cut.pieces(rank)[bucket]:
                # A piece lies where its rank's cut of the bucket says.
                assert cut.starts[bucket][piece.index] + piece.start == at + piece.at
                held[piece.index].append((piece.start, piece.stop))
            assert cut.cuts[bucket][rank + 1] - at <= cut.widths[bucket]
        for index, ranges in held.items():
            assert sorted(ranges) == [(a, b) for a, b in sorted(ranges)]
            covered = [e for a, b in sorted(ranges) for e in range(a, b)]
            assert covered == list(range(SIZES[index]))
            if whole and index not in split:
                assert ranges == [(0, SIZES[index])]


def test_element_wise_cuts_are_near_even_and_aligned_within_their_parameter():
    cut = partition(3, whole=False)
    total = sum(SIZES[i] for i in BUCKETS[0])
    starts = cut.starts[0]
    for rank in range(1, 3):
        at = cut.cuts[0][rank]
        assert abs(at - rank * total / 3) <= 32
        owner = max((s, i) for i, s in starts.items() if s <= at)
        assert (at - owner[0]) % 64 == 0


def test_whole_tensor_cuts_even_out_what_each_rank_holds_over_the_buckets():
    cut = partition(2, whole=True)
    # Bucket 0: 4096, 5 and 70,000 elements; the even cut, 37,050.5, is nearest the edge at
    # 4101, so rank 1 holds 70,000 of them. Bucket 1 (1139 elements) then goes whole to rank 0.
    assert cut.cuts == [[0, 4101, 74101], [0, 1139, 1139]]
    assert cut.widths[1] == 1139
    # Buckets of one large tensor each (a transformer's, a wide MLP's) go to the ranks in turn,
    # not all to one.
    from hvd_train.distributed.sharding import Partition

    lone = Partition([1000] * 12, [[i] for i in range(12)], 3, whole=True)
    held = [sum(p.stop - p.start for pieces in lone.pieces(r) for p in pieces) for r in range(3)]
    assert held == [4000, 4000, 4000]


def test_only_a_parameter_too_large_to_hold_whole_is_cut_inside():
    from hvd_train.distributed.sharding import too_large

    # Over half of a rank's even share: the 70,000 elements at 2 ranks, none of them at 1.
    assert too_large(SIZES, 2) == {3}
    cut = partition(2, True, too_large(SIZES, 2))
    # The even cut of bucket 0 (37,050.5) lies inside parameter 3, which starts at 4101: it
    # falls on the multiple of 64 elements into it nearest.
    assert cut.cuts[0] == [0, 4101 + 32960, 74101]
    assert [p.stop - p.start for p in cut.pieces(0)[0]] == [4096, 5, 32960]


def test_joined_buckets_are_cut_near_even():
    from hvd_train.distributed.sharding import EVEN_ENOUGH, Partition

    # A wide MLP's buckets: a bias and a kernel each. Alone, each bucket goes to one rank, and
    # its collectives wait on that rank's part; joined, the ranks' parts come out the same.
    sizes = [4096 if i % 2 == 0 else 2**22 for i in range(48)]
    buckets = [[i + 1, i] for i in range(46, -1, -2)]
    for ranks in (2, 3, 8):
        alone = Partition(sizes, buckets, ranks, whole=True)
        joined = Partition(sizes, buckets, ranks, whole=True, join=True)
        for cut in (alone, joined):
            assert sorted(i for bucket in cut.buckets for i in bucket) == list(range(48))
            held = [sum(p.stop - p.start for b in cut.pieces(r) for p in b) for r in range(ranks)]
            assert max(held) - min(held) <= 2**22 + 4096
        evenness = [np.diff(cuts).sum() / (ranks * np.diff(cuts).max()) for cuts in joined.cuts]
        assert min(evenness[:-1]) >= EVEN_ENOUGH and len(joined.buckets) < len(buckets)
        assert max(np.diff(cuts).sum() / (ranks * np.diff(cuts).max()) for cuts in alone.cuts
                   ) <= 1 / ranks + 1e-3  # fmt: skip


# Each stage under the real horovodrun.

EXACT = ["adamw", "sgd-accumulated", "rmsprop-bf16", "adam-fp16-mixed", "lamb"]
STAGES = ["optimizer", "gradients"]


def sharded(framework: str, out: Path, ranks: int,
            cases: tuple[str, ...]) -> dict[str, list[list[list[int]]]]:  # fmt: skip
    """What each rank's optimizer held per case and stage; the saved states lie in `out`."""
    out.mkdir(parents=True, exist_ok=True)
    result = horovodrun(script("sharded_steps.py"), framework, str(out), *cases, ranks=ranks)
    [line] = re.findall(r"^\[0\]<stdout>:SHARDED (.*)$", result.stdout, re.MULTILINE)
    everyone = json.loads(line)
    return {name: [rank[name] for rank in everyone] for name in everyone[0]}


@pytest.fixture(scope="module", params=FRAMEWORKS)
def at_two(request, tmp_path_factory) -> tuple[Path, dict[str, list[list[list[int]]]]]:
    out = tmp_path_factory.mktemp(f"sharded-2-{request.param}")
    return out, sharded(request.param, out, 2, ())


def saved(out: Path, case: str, shard: str) -> dict[str, np.ndarray]:
    with np.load(out / f"{case}-{shard}.npz") as arrays:
        return dict(arrays)


@pytest.mark.multiprocess
@pytest.mark.parametrize("stage", STAGES)
@pytest.mark.parametrize("case", EXACT)
def test_a_sharded_step_updates_as_the_unsharded_one_bit_for_bit(at_two, case, stage):
    out, _ = at_two
    whole, sharded_state = saved(out, case, "none"), saved(out, case, stage)
    assert sorted(sharded_state) == sorted(whole)
    assert any(name.startswith("optimizer.") for name in whole)
    differing = [name for name, array in whole.items()
                 if array.dtype != sharded_state[name].dtype
                 or not np.array_equal(array, sharded_state[name])]  # fmt: skip
    assert differing == []


@pytest.mark.multiprocess
@pytest.mark.parametrize("shard", ["none", *STAGES])
def test_a_parameter_no_step_reaches_is_skipped_as_one_process_skips_it(at_two, shard):
    # The model's first parameters (torch's `unused`, a Keras Dense layer's kernel and bias)
    # no pass reaches: plain torch and Keras skip them, so they keep their value under weight
    # decay (adamw, sgd-accumulated, lamb), and torch keeps no optimizer state for them.
    out, _ = at_two
    for case in EXACT:
        state = saved(out, case, shard)
        unused = [name for name in ("weight.unused", "weight.0000.kernel", "weight.0001.bias")
                  if name in state]  # fmt: skip
        assert unused and all(np.all(state[name] == 0.5) for name in unused), case
        if "weight.unused" in state:  # torch: its place is 0
            assert not [name for name in state if name.startswith("optimizer.0.")], case


@pytest.mark.multiprocess
@pytest.mark.parametrize("shard", ["none", *STAGES])
def test_a_loop_s_checkpoint_loads_into_a_loop_sharded_another_way(at_two, shard):
    # dist.save of each stage, dist.load by a loop with the next: none -> optimizer ->
    # gradients -> none. The same weights and optimizer state, every tensor.
    out, _ = at_two
    saved_state, loaded = saved(out, "adamw", shard), saved(out, "adamw", f"{shard}-reloaded")
    assert_same_weights(saved_state, loaded)


@pytest.mark.multiprocess
@pytest.mark.parametrize("stage", STAGES)
def test_clipped_gradients_take_the_norm_over_every_rank_s_part(at_two, stage):
    out, _ = at_two
    whole, sharded_state = saved(out, "sgd-clipped", "none"), saved(out, "sgd-clipped", stage)
    for name, array in whole.items():
        # The norm's squares add up in another order: within float32's rounding of each
        # tensor's scale, where a norm taken over one rank's part only would be far off.
        np.testing.assert_allclose(sharded_state[name], array, rtol=0,
                                   atol=1e-6 * np.abs(array).max(), err_msg=name)  # fmt: skip


@pytest.mark.multiprocess
def test_each_rank_holds_its_part_only(at_two):
    _, held = at_two
    whole = held["adamw-none"][0]
    sizes = [math.prod(shape) for shape in whole]
    for stage in STAGES:
        # Element-wise: about half the elements each (under torch, pieces of the parameters;
        # under TensorFlow, whole ones, but for the dense kernel, too large to hold whole).
        counts = [sum(map(math.prod, rank)) for rank in held[f"adamw-{stage}"]]
        assert sum(counts) == sum(sizes)
        assert max(counts) < 0.55 * sum(sizes)
        # LAMB: whole parameters, each on one rank.
        lamb = held[f"lamb-{stage}"]
        assert sorted(shape for rank in lamb for shape in rank) == sorted(whole)
        assert all(lamb)
        # What a rank holds whole is the model's own variable: a copy only of a run of the
        # kernel that is split (TensorFlow's variables have no views).
        kernel = max(sizes)
        for rank in held[f"adamw-{stage}-copies"]:
            assert all(len(shape) == 1 and shape[0] < kernel for shape in rank), rank
            assert len(rank) <= 1
        assert held[f"lamb-{stage}-copies"] == [[], []]


@pytest.mark.multiprocess
def test_under_tensorflow_both_stages_reduce_scatter_the_gradients(at_two):
    # What the unsharded allreduce sends, where an allreduce and then the weights' allgather
    # would send half as much again; the allreduce left is the norm's sum of squares.
    _, held = at_two
    if "adamw-none-sent" not in held:
        pytest.skip("under torch the exchange is no graph to read")
    sent = {shard: held[f"adamw-{shard}-sent"] for shard in ("none", *STAGES)}
    assert sent["none"] == [["HorovodGroupedAllreduce"]] * 2
    for stage in STAGES:
        assert sent[stage] == [["HorovodAllreduce", "HorovodGroupedAllgather",
                                "HorovodReducescatter"]] * 2, stage  # fmt: skip


@pytest.mark.multiprocess
@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_at_three_ranks_the_stages_stay_within_rounding(framework, tmp_path):
    held = sharded(framework, tmp_path, 3, ("adamw", "lamb"))
    assert all(len(held[f"adamw-{stage}"]) == 3 for stage in STAGES)
    for case in ("adamw", "lamb"):
        whole = saved(tmp_path, case, "none")
        # Three ranks add in other orders: the reduce-scatter, and (buckets sent as they fill)
        # the allreduce's own groups, unsharded too. The weights within a hundredth of one step
        # (the rate, 1e-3, as Adam and LAMB take about the rate each step), where another
        # rank's part or a missed average would be whole steps off.
        for stage in STAGES:
            sharded_state = saved(tmp_path, case, stage)
            for name, array in whole.items():
                if name.startswith("weight."):
                    np.testing.assert_allclose(sharded_state[name], array, rtol=0, atol=1e-5,
                                               err_msg=f"{stage}: {name}")  # fmt: skip


@pytest.mark.multiprocess
@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_the_trainer_s_checkpoints_do_not_say_how_they_were_sharded(framework, mnist_dir,
                                                                   tmp_path):  # fmt: skip
    # mnist_cnn under each stage at np=2 saves the unsharded run's checkpoint, tensor for
    # tensor; one of the sharded ones resumes at np=3, unsharded and sharded, alike (under
    # torch bit for bit; under TensorFlow, whose stages both reduce-scatter, within rounding).
    # overlap off: at three ranks, buckets grouped as they come would add up in other orders.
    common = ["--recipe", "mnist_cnn", "--framework", framework, "--data-dir", str(mnist_dir),
              "--epochs", "1", "--limit-steps", "12", "--seed", "5",
              "--set", "horovod.overlap=false"]  # fmt: skip
    runs = each_stage_ends_as_unsharded(common, tmp_path)
    resumed = {shard: tmp_path / f"resumed-{shard}" for shard in ("none", "optimizer")}
    for out in resumed.values():
        shutil.copytree(runs["gradients"], out)
    more = ["--resume", "--epochs", "2", "--data-dir", str(mnist_dir)]
    printed = trainings(*[[*more, "--output-dir", str(out), "--set", f'horovod.shard="{shard}"']
                          for shard, out in resumed.items()], ranks=3)  # fmt: skip
    assert all("resuming from" in text for text in printed), printed
    whole, sharded_weights = (saved_weights(resumed[shard], 2) for shard in resumed)
    if framework == "torch":  # "optimizer" allreduces in one buffer, as unsharded
        assert_same_weights(whole, sharded_weights)
        return
    # Three ranks' reduce-scatter adds in another order than their allreduce: within a
    # hundredth of one step (Adam takes about the rate, 3e-3 at np=3, a step), where a part
    # missed or taken twice would be steps off.
    assert whole.keys() == sharded_weights.keys()
    for name, array in whole.items():
        np.testing.assert_allclose(sharded_weights[name], array, rtol=0, atol=3e-5, err_msg=name)


@pytest.mark.multiprocess
@pytest.mark.torch
def test_the_trainer_s_rates_reach_the_updates_within_the_backward_pass(mnist_dir, tmp_path):
    # mnist_wide's gradients fill two buckets, so with overlap one bucket's pieces are updated
    # within the backward pass, and its rate decays every step: each stage ends on the
    # unsharded run's checkpoint (the rate set between the pass and the step would differ, or
    # stop the run).
    common = ["--recipe", script("mnist_wide.toml"), "--framework", "torch",
              "--data-dir", str(mnist_dir), "--limit-steps", "6", "--seed", "5",
              "--set", "horovod.overlap=true"]  # fmt: skip
    each_stage_ends_as_unsharded(common, tmp_path)


def each_stage_ends_as_unsharded(common: list[str], tmp_path: Path) -> dict[str, Path]:
    """`hvd-train COMMON` under each shard setting in one np=2 job: each stage's checkpoint
    (weights and optimizer state) is the unsharded run's, tensor for tensor. Each run's
    output directory, by setting."""
    runs = {shard: tmp_path / shard for shard in ("none", *STAGES)}
    trainings(*[[*common, "--output-dir", str(out), "--set", f'horovod.shard="{shard}"']
                for shard, out in runs.items()])  # fmt: skip
    for kept in ("model.safetensors", "optimizer.safetensors"):
        whole = saved_weights(runs["none"], 1, kept=kept)
        for stage in STAGES:
            assert_same_weights(whole, saved_weights(runs[stage], 1, kept=kept))
    return runs


@pytest.mark.multiprocess
@pytest.mark.torch
def test_shard_with_one_rank_says_once_that_it_trains_unsharded(mnist_dir, tmp_path):
    result = alone("-m", "hvd_train", "--recipe", "mnist_cnn", "--data-dir", str(mnist_dir),
                   "--epochs", "1", "--limit-steps", "2", "--output-dir", str(tmp_path),
                   "--set", 'horovod.shard="gradients"')  # fmt: skip
    said = 'hvd-train: shard = "gradients" with one rank: nothing to share out'
    assert (result.stdout + result.stderr).count(said) == 1
    assert (tmp_path / "summary.json").exists()


@pytest.mark.multiprocess
@pytest.mark.torch
@pytest.mark.tensorflow
def test_what_does_not_shard_says_so_in_one_line(mnist_dir, tmp_path):
    # hvd-train bench projects links from the unsharded step (each framework); an elastic job
    # would lose a leaving rank's part (torch; refused even at one rank, as ranks may join).
    benches = [
        [
            str(HOROVODRUN),
            "-np",
            "2",
            "--gloo",
            sys.executable,
            "-m",
            "hvd_train",
            "bench",
            "--recipe",
            "mnist_cnn",
            "--framework",
            framework,
            "--set",
            'horovod.shard="optimizer"',
            "--links",
            "1",
        ]
        for framework in ("torch", "tensorflow")
    ]
    (tmp_path / "hosts").write_text("localhost:1\n")
    elastic, _ = elastic_job(tmp_path, 1, "--recipe", "mnist_cnn", "--data-dir", str(mnist_dir),
                             "--set", 'horovod.shard="gradients"')  # fmt: skip
    results = [subprocess.run(bench, capture_output=True, text=True, timeout=300)
               for bench in benches]  # fmt: skip
    printed = elastic.communicate(timeout=300)[0]  # stdout and stderr, together
    results.append(subprocess.CompletedProcess(elastic.args, elastic.returncode, printed, ""))
    said = ["--links projects from the unsharded step"] * 2
    said.append("does not train under horovodrun's elastic mode")
    for result, expected in zip(results, said, strict=True):
        output = result.stdout + result.stderr
        lines = [line for line in output.splitlines() if "hvd-train: error:" in line]
        assert result.returncode == 2 and len(lines) == 1 and expected in lines[0], output
