"""The exceptions the CLI turns into a one-line message: the one type for user mistakes, a stop
at a signal, and replicas that diverged; and which rank of a job prints that line."""

from __future__ import annotations

import os
import sys


class UsageError(Exception):
    """A bad flag, recipe, data file, checkpoint or environment: the message says what to do.

    `every_rank`: every rank of the job raised it alike (rank 0 handed it out, or the ranks
    decided it from the same numbers), so rank 0 alone reports it."""

    def __init__(self, message: str, *, every_rank: bool = False) -> None:
        super().__init__(message)
        self.every_rank = every_rank


class DataStalled(UsageError):
    """The data workers read no batch within the timeout: the source hangs. Their threads
    cannot be stopped, and Python waits for them at exit, so the process exits at once."""


class Stopped(Exception):
    """The job stopped at a signal after checkpointing; the message says how to resume."""

    def __init__(self, signum: int, message: str) -> None:
        super().__init__(message)
        self.signum = signum

    def __reduce__(self) -> tuple[type, tuple[int, str]]:  # as a rank hands it to `launch`
        return (Stopped, (self.signum, str(self)))


class ReplicasDiverged(Exception):
    """The ranks' replicas no longer hold the same weights: a bug, not a user's mistake, but one
    that the message (naming the first differing tensor) describes better than a traceback.
    Every rank raises it, from the same allgather."""

    every_rank = True


# Where launchers put a process's rank and its rank on its host: horovodrun (Gloo), Open MPI.
RANK_VARIABLES = ("HOROVOD_RANK", "OMPI_COMM_WORLD_RANK")
LOCAL_RANK_VARIABLES = ("HOROVOD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK")


def launched_rank(variables: tuple[str, ...]) -> int:
    """This process's rank as its launcher set it (0 when run alone)."""
    return next((int(os.environ[name]) for name in variables if name in os.environ), 0)


def reported_here(error: BaseException) -> bool:
    """Whether this rank prints `error`'s line, so that a job prints each mistake once. One that
    every rank raised alike is printed by rank 0. One met before Horovod started (a flag, the
    recipe) is printed by the first rank of each host: every rank of a host reads the same
    command line and files, while another host's may differ. Any other is this rank's own."""
    if getattr(error, "every_rank", False):
        return launched_rank(RANK_VARIABLES) == 0
    if not horovod_started():
        return launched_rank(LOCAL_RANK_VARIABLES) == 0
    return True


def report(error: BaseException) -> None:
    """`error`'s one line on stderr, where this rank is the one to say it."""
    if reported_here(error):
        print(f"hvd-train: error: {error}", file=sys.stderr, flush=True)


def horovod_started() -> bool:
    """Whether this process initialised a Horovod binding (imported only by a backend): a
    module `horovod.<framework>`, which tells `is_initialized()`."""
    bindings = [module for name, module in list(sys.modules.items())
                if name.startswith("horovod.") and name.count(".") == 1]  # fmt: skip
    started = [getattr(binding, "is_initialized", None) for binding in bindings]
    return any(callable(is_started) and is_started() for is_started in started)
