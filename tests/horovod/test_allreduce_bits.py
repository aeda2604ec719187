"""The patched Horovod's allreduce, under the real horovodrun: every rank gets the same bits for
every dtype, reduction and way of enqueueing, and the exact answer wherever there is one
(allreduce_bits.py says where), bfloat16 included. Gloo's two-rank exchange (np=2), its ring
(np=3), and MPI."""

import json
import shutil

import pytest

from tests.horovodrun import horovodrun, script

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(300)]

SCRIPT = script("horovod/allreduce_bits.py")
# The float16 sums found to differ between the ranks of the two-rank exchange.
REVIEWED = {
    "float16 wide sum single",  # 200,000 values with a standard deviation of 1e4
    "float16 pair(0.5,14336.0) sum single",
    "float16 pair(-1.0,48128.0) sum single",
}
PAIRS = {"float16 pair(0.5,14336.0)", "float16 pair(-1.0,48128.0)"}
# Gloo's float16 max assigned through the same faulty comparison.
MAXIMA = {"float16 wide max single", "float16 pair(0.5,14336.0) max single"}


@pytest.mark.parametrize(
    ("framework", "ranks", "controller"),
    [
        pytest.param("torch", 2, "--gloo", marks=pytest.mark.torch),
        pytest.param("torch", 3, "--gloo", marks=pytest.mark.torch),
        pytest.param("tensorflow", 2, "--gloo", marks=pytest.mark.tensorflow),
        pytest.param("torch", 2, "--mpi", marks=pytest.mark.torch),
    ],
)
def test_ranks_get_the_same_bits_and_the_exact_answer(framework, ranks, controller, tmp_path):
    if controller == "--mpi" and shutil.which("mpirun") is None:
        pytest.skip("Open MPI is not installed here (make setup installs it where it can)")
    out = tmp_path / "records.json"
    horovodrun(SCRIPT, framework, str(out), ranks=ranks, horovodrun_options=[controller])
    records = json.loads(out.read_text())
    assert [r for r in records if r["agree"] is False] == []
    assert [r for r in records if r["exact"] is False] == []
    exact = {r["case"] for r in records if r["exact"]}
    assert exact >= MAXIMA
    if ranks == 2:
        assert exact >= REVIEWED
        # A reduce-scatter's float16 and bfloat16 sums, rounded once as the allreduce's are.
        wide = PAIRS | {"float16 wide", "bfloat16 wide"}
        assert exact >= {f"{case} sum reducescatter" for case in wide}
        # bfloat16 sums of two ranks, whichever way enqueued: added in float, rounded once.
        modes = ("single", "fused", "grouped", "in place")[: 4 if framework == "torch" else 3]
        assert exact >= {f"bfloat16 wide sum {mode}" for mode in modes}
        # Its infinities, NaNs and overflow: Inf, NaN, NaN, NaN, Inf.
        specials = ("inf+1", "inf-inf", "nan+1", "-nan+2", "overflow")
        assert exact >= {f"bfloat16 {name} sum single" for name in specials}
        # ... in the vector lanes and the tail of a longer sum too, and reduce-scattered.
        assert exact >= {f"bfloat16 {name} lanes sum {way}" for name in specials
                         for way in ("single", "reducescatter")}  # fmt: skip
        assert exact >= {"bfloat16 inf+1 max single", "bfloat16 inf-inf max single"}
    small = {f"{dtype} small sum reducescatter" for dtype in ("float16", "bfloat16", "float32")}
    assert small <= exact
    # Every dtype's small integers are summed exactly, whichever way they were enqueued; torch's
    # slices of one buffer too, reduced where they lie.
    modes = ("single", "fused", "grouped", "in place")[: 4 if framework == "torch" else 3]
    assert {f"{dtype} small {reduction} {mode}"
            for dtype in ("int32", "float16", "bfloat16", "float64")
            for reduction in ("sum", "min", "max")
            for mode in modes} <= exact  # fmt: skip


@pytest.mark.torch
def test_the_two_rank_exchange_keeps_no_buffer_the_size_of_a_large_allreduce():
    result = horovodrun(script("horovod/pair_memory.py"))
    memory = json.loads(result.stdout.split("MEMORY ", 1)[1].splitlines()[0])
    assert memory["correct"]
    # 256 MiB went through; the exchange may keep two chunks of 4 MiB of the peer's values.
    assert memory["after"] - memory["before"] < 32, memory


@pytest.mark.torch
@pytest.mark.parametrize("controller", ["--gloo", "--mpi"])
def test_slices_of_one_buffer_are_reduced_where_they_lie_without_a_copy(controller, tmp_path):
    if controller == "--mpi" and shutil.which("mpirun") is None:
        pytest.skip("Open MPI is not installed here (make setup installs it where it can)")
    timeline = tmp_path / "timeline.json"
    timed = script("horovod/in_place_timeline.py")
    result = horovodrun(timed, horovodrun_options=[controller, "--timeline-filename",
                                                    str(timeline)])  # fmt: skip
    assert result.stdout.count("OK") == 2, result.stdout + result.stderr
    text = timeline.read_text().rstrip().rstrip(",")
    events = json.loads(text if text.endswith("]") else text + "]")
    tensors = {e["pid"]: e["args"]["name"] for e in events
               if e.get("name") == "process_name" and "name" in e["args"]}  # fmt: skip
    kind = {pid: name.split(".")[1] for pid, name in tensors.items()}  # grouped_allreduce.KIND.i
    copied = {kind[e["pid"]] for e in events if e.get("name") == "MEMCPY_IN_FUSION_BUFFER"}
    reduced = {kind[e["pid"]] for e in events if e.get("name") == "ALLREDUCE"}
    # Both groups were reduced, and the timeline records the copies into the fusion buffer:
    # those of the separate tensors, none of the slices of one buffer.
    assert reduced == {"in_place", "copied"}, tensors
    assert copied == {"copied"}
