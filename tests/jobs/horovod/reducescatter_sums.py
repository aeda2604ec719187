"""Runs inside each rank under `horovodrun`: reduce-scatters, round after round, a float32 tensor
large enough that its sends are still going when a rank has its own part summed, and prints, as
`ROUNDS {...}` on each rank, how many rounds gave this rank a part other than the exact sums
(every value an integer, so any order of the additions gives the same bits), and where the
first wrong value of each lay.

    horovodrun -np 2 --gloo python reducescatter_sums.py ELEMENTS_PER_RANK ROUNDS
"""

import json
import sys

import horovod.torch as hvd
import torch


def main() -> None:
    hvd.init()
    per_rank, rounds = int(sys.argv[1]), int(sys.argv[2])
    size, rank = hvd.size(), hvd.rank()
    pattern = torch.arange(per_rank * size, dtype=torch.float32) % 1024
    mine = pattern[rank * per_rank : (rank + 1) * per_rank]  # the pattern of this rank's part
    wrong = []
    for number in range(rounds):
        # Rank r sends pattern + 1000 (r + 1) + number: each rank's values differ from its peers'.
        sent = pattern + 1000 * (rank + 1) + number
        part = hvd.reducescatter(sent, op=hvd.Sum, name="sums")
        expected = mine * size + 1000 * size * (size + 1) // 2 + size * number
        if not torch.equal(part, expected):
            first = int((part != expected).nonzero()[0])
            wrong.append({"round": number, "first_wrong": first, "of": per_rank})
    print("ROUNDS " + json.dumps({"rank": rank, "rounds": rounds, "wrong": wrong}), flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
