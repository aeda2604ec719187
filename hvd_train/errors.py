"""The one exception type for user mistakes; the CLI turns it into a one-line message."""


class UsageError(Exception):
    """A bad flag, recipe, data file, checkpoint or environment: the message says what to do."""


class Stopped(Exception):
    """The job stopped at a signal after checkpointing; the message says how to resume."""

    def __init__(self, signum: int, message: str) -> None:
        super().__init__(message)
        self.signum = signum
