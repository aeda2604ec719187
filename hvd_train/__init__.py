"""hvd_train: Horovod data-parallel training from one recipe, under PyTorch or TensorFlow."""

__version__ = "0.1.0"
