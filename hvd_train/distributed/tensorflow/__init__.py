"""TensorFlow 2 with Keras 3 under Horovod: the TensorFlow backend (`backend.py`) and what it is
made of: the averaging optimizer (`exchange.py`), the compiled step (`compiled.py`), the sharded
state (`sharding.py`) and the optimizers (`optimizers.py`). Imported only where a job chose
TensorFlow (`distributed/backends.py`)."""
