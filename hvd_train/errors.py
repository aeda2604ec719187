"""The exceptions the CLI turns into a one-line message: the one type for user mistakes, a stop
at a signal, and replicas that diverged."""


class UsageError(Exception):
    """A bad flag, recipe, data file, checkpoint or environment: the message says what to do."""


class Stopped(Exception):
    """The job stopped at a signal after checkpointing; the message says how to resume."""

    def __init__(self, signum: int, message: str) -> None:
        super().__init__(message)
        self.signum = signum


class ReplicasDiverged(Exception):
    """The ranks' replicas no longer hold the same weights: a bug, not a user's mistake, but one
    that the message (naming the first differing tensor) describes better than a traceback."""
