"""The patched Horovod's reduce-scatter under Gloo, under the real horovodrun: round after round,
every rank gets the exact sums of its part (patch 19). Gloo's halving-doubling reduce-scatter
moved a rank's result to the start of its buffer while its sends from there could still be
going, and a peer then summed the tail of its part with that result: at np=2 about one round in
a hundred of these sizes, so the rounds here make a miss all but certain without the patch. At
np=3 the ranks outside the largest power of two take the algorithm's other sends; a few rounds
check those."""

import json

import pytest

from tests.horovodrun import horovodrun, script

pytestmark = [pytest.mark.multiprocess, pytest.mark.torch, pytest.mark.timeout(300)]

SCRIPT = script("horovod/reducescatter_sums.py")


@pytest.mark.parametrize(("ranks", "per_rank", "rounds"), [(2, 2_400_000, 500), (3, 800_000, 20)])
def test_every_round_gives_each_rank_the_exact_sums_of_its_part(ranks, per_rank, rounds):
    result = horovodrun(SCRIPT, str(per_rank), str(rounds), ranks=ranks)
    reports = [json.loads(line.split("ROUNDS ", 1)[1])
               for line in result.stdout.splitlines() if "ROUNDS " in line]  # fmt: skip
    assert sorted(report["rank"] for report in reports) == list(range(ranks))
    wrong = {report["rank"]: report["wrong"] for report in reports if report["wrong"]}
    assert wrong == {}, f"rounds with wrong sums, by rank: {wrong}"
