"""The distributed layer: `Distributed` (`facade.py`), Horovod's five steps for any training
loop, hvd_train's own trainer among them, over its facets, each with one job: `environment.py`
(the framework's backend started, where this rank stands), `precision.py`, `collectives.py`,
`exchange.py` (the model and optimizer set up for the exchange: steps, evaluation, state),
`checkpoints.py` (the one checkpoint path) and `loader.py` (a rank's batches). Under them, one
backend per framework (`torch/`, `tensorflow/`) in the shape of `backend.py`, made by
`backends.py`. What the rest of the package uses of this floor are the names below."""

from hvd_train.distributed.backend import ElasticState, ModelState, StepResult
from hvd_train.distributed.checkpoint_files import Arrays
from hvd_train.distributed.checkpoints import Best, Found, Layout, saved_framework
from hvd_train.distributed.facade import Distributed
from hvd_train.distributed.loader import Loader
from hvd_train.distributed.overlap import buckets

__all__ = ["Arrays", "Best", "Distributed", "ElasticState", "Found", "Layout", "Loader",
           "ModelState", "StepResult", "buckets", "saved_framework"]  # fmt: skip
