"""`hvd-train bench` alone and under the real `horovodrun -np 2`: its figures add up, say what
travels, and only rank 0 prints them."""

import json
import subprocess
import sys

import pytest

from hvd_train.commands.bench import RankTimes, projected_efficiency, report
from tests.conftest import FRAMEWORKS
from tests.horovodrun import alone, horovodrun, script, trainings

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(600)]
BENCH = ["-m", "hvd_train", "bench", "--synthetic", "--steps", "8", "--warmup", "2", "--json"]
# mnist_cnn's weights and biases: conv 5x5x1x32, conv 5x5x32x64, dense 1024x128, dense 128x10.
PARAMETERS = (25 * 32 + 32) + (25 * 32 * 64 + 64) + (1024 * 128 + 128) + (128 * 10 + 10)


def figures(output: str) -> list[dict]:
    return [json.loads(line.split(":", 1)[1]) for line in output.splitlines() if '{"world' in line]


def test_report_splits_the_step_and_sets_it_against_the_limit():
    rank = RankTimes(examples=64, data=0.002, compute=0.03, sync=0.01, hide=0.02, local=0.04,
                     allreduce=0.004)  # fmt: skip
    f = report([rank, rank], wall=100 * 0.05, steps=100, gradient_bytes=2_000_000)
    assert f["images_per_second"] == pytest.approx(2560) and f["step_ms"] == pytest.approx(50)
    assert (f["t_data_ms"], f["t_comp_ms"], f["t_sync_ms"], f["t_other_ms"]) == pytest.approx(
        (2, 30, 10, 8)
    )
    assert f["limit_images_per_second"] == pytest.approx(3200)
    assert f["scaling_efficiency"] == pytest.approx(0.8)
    assert f["plain_allreduce_mb_per_s"] == pytest.approx(500)
    assert f["step_exchange_mb_per_s"] == pytest.approx(200)
    assert f["t_hide_ms"] == pytest.approx(20)


def test_projection_adds_the_time_the_ring_sends_on_the_link():
    f = {"step_ms": 50.0, "local_step_ms": 40.0, "gradient_mb": 1.0, "t_hide_ms": 0.0,
         "overlap": "auto"}  # fmt: skip
    # Two hosts: each sends 2(N-1)/N = all of its 1 MB, 8 Mbit: 80 ms at 0.1 Gbit/s; 64 hosts:
    # 63/32 of it. With one bucket, nothing hides it.
    assert projected_efficiency(f, 2, 0.1) == pytest.approx(40 / (50 + 80))
    assert projected_efficiency(f, 64, 0.1) == pytest.approx(40 / (50 + 160 * 63 / 64))
    assert projected_efficiency(f, 2, 10.0) == pytest.approx(40 / (50 + 0.8))
    # A link next to free leaves the step as it is.
    assert projected_efficiency(f, 2, 1e9) == pytest.approx(0.8)


def test_projection_takes_off_what_the_backward_pass_hides_unless_overlap_is_off():
    f = {"step_ms": 50.0, "local_step_ms": 40.0, "gradient_mb": 1.0, "t_hide_ms": 30.0}
    # 80 ms on the link at 0.1 Gbit/s, of which the last pass hides 30; at 10 Gbit/s all 0.8.
    assert projected_efficiency(f | {"overlap": "auto"}, 2, 0.1) == pytest.approx(40 / 100)
    assert projected_efficiency(f | {"overlap": True}, 2, 10.0) == pytest.approx(0.8)
    assert projected_efficiency(f | {"overlap": False}, 2, 0.1) == pytest.approx(40 / 130)


def test_report_of_a_sharded_step_leaves_the_unsharded_figures_out():
    rank = RankTimes(examples=64, data=0.002, compute=0.03, sync=0.01, hide=0.02, local=None,
                     allreduce=None)  # fmt: skip
    f = report([rank, rank], wall=100 * 0.05, steps=100, gradient_bytes=2_000_000)
    assert f["images_per_second"] == pytest.approx(2560) and f["t_other_ms"] == pytest.approx(8)
    assert f["limit_images_per_second"] is None and f["scaling_efficiency"] is None
    assert f["plain_allreduce_ms"] is None and f["local_step_ms"] is None


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_bench_under_horovodrun_times_the_exchange_on_rank_zero_only(framework):
    # As given, with its gradients sent as bf16, and sharded, one after the other in one job.
    output, compressed_output, sharded_output = trainings(
        [*BENCH[2:], "--framework", framework, "--links", "100000,0.1"],
        [*BENCH[2:], "--framework", framework, "--set", "compression=bf16"],
        [*BENCH[2:], "--framework", framework, "--set", 'horovod.shard="gradients"'],
    )
    [bench] = figures(output)  # rank 1 prints nothing
    assert output.count('{"world') == 1 and '[0]<stdout>:{"world' in output
    assert bench["world_size"] == 2 and bench["global_batch"] == 128
    assert bench["t_comp_ms"] > 0 and bench["t_sync_ms"] > 0 and bench["t_other_ms"] >= 0
    assert bench["t_data_ms"] >= 0
    parts = bench["t_data_ms"] + bench["t_comp_ms"] + bench["t_sync_ms"] + bench["t_other_ms"]
    assert parts == pytest.approx(bench["step_ms"], abs=0.05)
    assert bench["images_per_second"] == pytest.approx(128_000 / bench["step_ms"], rel=0.01)
    assert bench["scaling_efficiency"] > 0 and bench["limit_images_per_second"] > 0
    assert bench["gradient_mb"] == pytest.approx(4 * PARAMETERS / 1e6, abs=0.001)
    free, slow = bench["projection"]["100000"], bench["projection"]["0.1"]
    assert list(free) == ["2", "4", "8", "16", "32", "64"]
    assert free["2"] == pytest.approx(bench["scaling_efficiency"], abs=0.002)
    wire_ms = bench["gradient_mb"] * 8 / 0.1  # two hosts, each sending all of it
    expected = bench["local_step_ms"] / (bench["step_ms"] + wire_ms)
    assert slow["2"] == pytest.approx(expected, abs=0.001) and slow["64"] < slow["2"]
    [compressed] = figures(compressed_output)
    assert compressed["gradient_mb"] == pytest.approx(2 * PARAMETERS / 1e6, abs=0.001)
    # Sharded: the training steps only (the limit and the plain allreduce are unsharded).
    [sharded] = figures(sharded_output)
    assert sharded["t_comp_ms"] > 0 and sharded["t_sync_ms"] > 0
    assert sharded["images_per_second"] == pytest.approx(128_000 / sharded["step_ms"], rel=0.01)
    assert sharded["limit_images_per_second"] is None and sharded["plain_allreduce_ms"] is None


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_bench_alone_has_nothing_to_exchange(framework):
    bench = json.loads(alone(*BENCH, "--framework", framework).stdout.splitlines()[-1])
    assert bench["world_size"] == 1 and bench["global_batch"] == 64
    # No exchange to wait for: what is left is timing noise, a sliver of the passes' time (under
    # horovodrun the exchange takes milliseconds).
    assert 0 <= bench["t_sync_ms"] < 0.05 * bench["t_comp_ms"]
    projecting = [sys.executable, *BENCH, "--framework", framework, "--links", "1"]
    refused = subprocess.run(projecting, capture_output=True, text=True, timeout=300)
    assert refused.returncode == 2
    assert "--links projects from a measured exchange" in refused.stderr.strip().splitlines()[-1]


def test_the_wait_for_data_is_the_sources_own():
    # slow_source.py's source waits 10 ms on every read; with no workers, the step waits it out.
    recipe = script("slow_source.py")
    output = horovodrun(*BENCH[:3], "--recipe", recipe, "--framework", "torch", "--steps", "8",
                        "--warmup", "2", "--json", "--set", "data.workers=0").stdout  # fmt: skip
    [bench] = figures(output)
    assert 10 <= bench["t_data_ms"] < bench["step_ms"], bench
