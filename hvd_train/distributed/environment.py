"""Where this process stands in the job: the framework's backend made and started (Horovod
initialised, or joined where a launcher started the job, and this process pinned to its GPU or
its share of the CPU cores), its rank and sizes, its host, and one line for a user's mistake
that ends the loop."""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Callable
from types import TracebackType
from typing import Any

from hvd_train.distributed.backend import Backend
from hvd_train.distributed.backends import create_backend
from hvd_train.distributed.host import host_name, threads_per_rank
from hvd_train.distributed.precision import Precision
from hvd_train.errors import UsageError, report
from hvd_train.frameworks import FRAMEWORKS, framework_named

MEETING_SECONDS = 10.0  # how long a rank ending on a mistake every rank makes waits for the others


def framework_in_use() -> str:
    """The framework whose module the loop imported, where it imported one only."""
    imported = [name for name, f in FRAMEWORKS.items() if f.module in sys.modules]
    if len(imported) != 1:
        found = " and ".join(imported) or "neither"
        raise UsageError(
            f"Distributed: the loop imported {found} of {', '.join(FRAMEWORKS)}; name the "
            f"framework: {' or '.join(f'Distributed({name!r})' for name in FRAMEWORKS)}"
        )
    return imported[0]


class Environment:
    """The backend of `framework` (where None, of the one the loop imported), started in
    `precision`; `may_overlap`: whether steps may send gradients while the backward pass goes
    on (TensorFlow then runs one op more at a time than it has cores). From now on a
    `UsageError` that ends the process is one line and exit code 2."""

    def __init__(self, framework: str | None, precision: Precision, may_overlap: bool) -> None:
        name = framework_named(framework or framework_in_use()).name
        self.backend: Backend = create_backend(name)
        self.backend.start(precision.mixed, may_overlap)
        say_usage_errors_in_one_line(self.backend)

    @property
    def framework(self) -> str:
        return self.backend.name

    @property
    def rank(self) -> int:
        return self.backend.rank

    @property
    def local_rank(self) -> int:
        return self.backend.local_rank

    @property
    def world_size(self) -> int:
        return self.backend.world_size

    @property
    def local_size(self) -> int:
        return self.backend.local_size

    @property
    def device(self) -> Any:
        return self.backend.device

    @property
    def host(self) -> str:
        return host_name()

    @property
    def threads(self) -> int:
        return threads_per_rank(self.local_size)

    def logger(self, name: str | None) -> logging.Logger:
        """The logger `name`, whose records rank 0 alone emits."""
        logger = logging.getLogger(name)
        if not any(isinstance(f, _OnRankZero) for f in logger.filters):
            logger.addFilter(_OnRankZero(self.backend))
        return logger


class _OnRankZero(logging.Filter):
    def __init__(self, backend: Backend) -> None:
        super().__init__()
        self.backend = backend  # its rank, which an elastic reset may change

    def filter(self, record: logging.LogRecord) -> bool:
        return self.backend.rank == 0


def say_usage_errors_in_one_line(backend: Backend) -> None:
    """A UsageError that ends the loop's script is one line and exit code 2, as the CLI's."""
    if not isinstance(sys.excepthook, _OneLine):
        sys.excepthook = _OneLine(sys.excepthook)
    sys.excepthook.backend = backend


class _OneLine:
    """`sys.excepthook` for a UsageError: its line, exit code 2. One that every rank raises
    alike waits (`MEETING_SECONDS` at most) for the other ranks to raise it too before the
    process ends: a rank that ended at once would cut the collective that a slower rank still
    finishes, whose core would then print an error of its own."""

    backend: Backend

    def __init__(self, previous: Callable[..., Any]) -> None:
        self.previous = previous

    def __call__(self, kind: type[BaseException], error: BaseException,
                 traceback: TracebackType | None) -> None:  # fmt: skip
        if not isinstance(error, UsageError):
            self.previous(kind, error, traceback)
            return
        report(error)
        sys.stdout.flush()
        sys.stderr.flush()
        if error.every_rank and self.backend.world_size > 1:
            meeting = threading.Thread(target=self.backend.hvd.join, daemon=True)
            meeting.start()
            meeting.join(MEETING_SECONDS)
        os._exit(2)
