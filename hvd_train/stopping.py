"""Stopping a job cleanly: on SIGTERM (Slurm and Kubernetes preempt with it) or SIGINT
(Ctrl-C), and when rank 0 fails to write. A rank that wants to stop raises a flag; the flags
travel with the next step's gradients, so every rank learns of it at the same step boundary
without a collective of its own, and the job checkpoints there and ends.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

import numpy as np

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class StopRequests:
    """This rank's reasons to stop: a signal received, or a write that failed (rank 0)."""

    def __init__(self) -> None:
        self.signal: int | None = None
        self.failure: str | None = None

    def _received(self, signum: int, frame: FrameType | None) -> None:
        if self.signal is not None:  # the second one: the user insists
            raise KeyboardInterrupt
        self.signal = signum

    @contextmanager
    def catching_signals(self) -> Iterator[None]:
        """While training, SIGTERM and SIGINT ask for a stop at the next step boundary."""
        if threading.current_thread() is not threading.main_thread():
            yield  # signals reach the main thread only; elsewhere they keep their defaults
            return
        previous = {number: signal.signal(number, self._received) for number in SIGNALS}
        try:
            yield
        finally:
            for number, handler in previous.items():
                signal.signal(number, handler)

    def flags(self) -> np.ndarray:
        """The flags for the next step: [signal received, write failed]."""
        return np.array([self.signal is not None, self.failure is not None], np.float64)
