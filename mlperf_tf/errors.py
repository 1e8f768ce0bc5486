"""Provides `UserError`: bad input that the CLI reports as one line and exit code 2."""


class UserError(Exception):
    """A problem with what the user gave (a flag, a path, a file's content), not a bug.

    The message must name the bad input and say what was expected; the CLI prints it as
    `error: <message>` and exits with code 2, without a traceback.
    """


class DataError(UserError, ValueError):
    """Input data is missing, empty or corrupt; the message names the file or path."""
