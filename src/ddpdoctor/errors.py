"""Errors the CLI turns into one line on stderr and an exit code, 2 unless they say (never a traceback)."""


class UsageError(Exception):
    """The user asked for something that cannot be done as asked (bad flag value, unknown rule, ...)."""

    exit_code = 2


class InputError(Exception):
    """An input (file, log, recorded run) could not be read or is not what it should be."""
