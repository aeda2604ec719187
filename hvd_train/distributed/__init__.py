"""The distributed layer: `Distributed` (`layer.py`), Horovod's five steps for any training
loop, hvd_train's own trainer among them; its `Loader` of a rank's batches (`loader.py`); and
under it one backend per framework (`torch/`, `tensorflow/`), registered in `frameworks.py`, each
the strategy `backend.py` describes."""
