"""Stopping a job cleanly: on SIGTERM (Slurm and Kubernetes preempt with it) or SIGINT
(Ctrl-C), when rank 0 fails to write, when a callback raises or asks to stop. A rank that wants
to stop raises a flag; the flags travel with the next step's gradients, so every rank learns of
it at the same step boundary without a collective of its own, and the job checkpoints there
and ends. (At an epoch's end the loop gathers them at once: no step follows there.)
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
    """This rank's reasons to stop: a signal received, a write that failed (rank 0), a
    callback that raised, a callback's request."""

    def __init__(self) -> None:
        self.signal: int | None = None
        self.failure: str | None = None  # ends the job without writing more
        self.error: str | None = None  # ends the job after a checkpoint
        self.asked = False  # ends training as if at its last step

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
        """The flags for the next step: [signal received, write failed, a callback raised, a
        callback asked to stop]."""
        reasons = (self.signal, self.failure, self.error)
        return np.array([*(reason is not None for reason in reasons), self.asked], np.float64)

    def callback_flags(self) -> np.ndarray:
        """The callbacks' flags alone, which the loop gathers at an epoch's end (signals and
        failed writes wait for the next step, so that a finished run ends as finished)."""
        return self.flags() * [0, 0, 1, 1]

    def reasons(self) -> tuple[str | None, str | None, int | None, bool]:
        """What `stop` gathers from every rank."""
        return self.failure, self.error, self.signal, self.asked
