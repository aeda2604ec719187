"""PyTorch under Horovod: the torch backend (`backend.py`) and what it is made of: the model
wrappers and mixed precision (`modules.py`), the gradients' exchange and the distributed
optimizer (`exchange.py`), the sharded state (`sharding.py`), the optimizers and their state
(`optimizers.py`), the export (`export.py`) and the elastic state (`elastic.py`). Imported only
where a job chose torch (`distributed/backends.py`)."""
