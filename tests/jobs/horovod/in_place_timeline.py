"""Under horovodrun -np 2 with Horovod's timeline on (HOROVOD_TIMELINE): a grouped allreduce of
the consecutive slices of one buffer, in place (`in_place.*`), and one of separate tensors
(`copied.*`), both checked against the exact sums. The test reads in the timeline which of
them went through the fusion buffer."""

import horovod.torch as hvd
import torch

hvd.init()
sizes = [1000, 3000, 500, 2000]
flat = torch.arange(sum(sizes), dtype=torch.float32) * (hvd.rank() + 1)
expected = torch.arange(sum(sizes), dtype=torch.float32) * 3  # ranks 0 and 1: x1 + x2
for round_ in range(3):
    hvd.grouped_allreduce_(list(flat.split(sizes)), name=f"in_place.{round_}", op=hvd.Sum)
    assert torch.equal(flat, expected * 2**round_)  # both ranks hold the last sum
    pieces = [piece.clone() for piece in expected.split(sizes)]
    summed = hvd.grouped_allreduce(pieces, name=f"copied.{round_}", op=hvd.Sum)
    assert torch.equal(torch.cat(summed), expected * 2)
hvd.shutdown()  # the timeline is complete
print("OK")
