"""Horovod under each framework: the registry of frameworks and their backends."""
