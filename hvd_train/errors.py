"""The one exception type for user mistakes; the CLI turns it into a one-line message."""


class UsageError(Exception):
    """A bad flag, recipe, data file, checkpoint or environment: the message says what to do."""
