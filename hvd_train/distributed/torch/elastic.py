"""The torch backend under Horovod's elastic driver (Gloo only): the state a reset restores."""

from __future__ import annotations

from typing import TYPE_CHECKING

import horovod.torch as hvd
from horovod.common.elastic import ObjectState

if TYPE_CHECKING:
    from hvd_train.distributed.torch.backend import TorchBackend


class ElasticTorchState(ObjectState):
    """The model, the optimizer and the position, for Horovod's elastic driver.

    Horovod's own TorchState syncs an optimizer by broadcasting its state, and a worker whose
    optimizer has none yet (a fresh start, a worker that just joined) first makes one by taking
    a step with zero gradients. Under weight decay that step moves every weight, and after a
    join only the newcomer takes it: its replica differs from then on. Here rank 0's optimizer
    state is handed out as it is, even empty, and nothing steps.
    """

    def __init__(self, backend: TorchBackend) -> None:
        self.backend = backend
        super().__init__(bcast_object=hvd.broadcast_object, get_rank=hvd.rank,
                         epoch=0, samples=0, started=False)  # fmt: skip
        self.save()

    def save(self) -> None:
        self.model = {name: t.detach().clone() for name, t in self.backend.net.state().items()}
        self.optimizer = self.backend.optimizer_state.arrays()
        super().save()

    def restore(self) -> None:
        import torch

        with torch.no_grad():
            for name, tensor in self.backend.net.state().items():
                tensor.copy_(self.model[name])
        self.backend.optimizer_state.load(self.optimizer)
        # A step cut short by the failure: its gradients and its count of passes start anew.
        self.backend.exchange.clear()
        self.backend.exchange.stepped()
        super().restore()

    def sync(self) -> None:
        self.backend.broadcast_state(include_optimizer=True)
        super().sync()
