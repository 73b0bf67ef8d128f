"""Errors the CLI turns into one line on stderr and exit code 2 (never a traceback)."""


class UsageError(Exception):
    """The user asked for something that cannot be done as asked (bad flag value, unknown rule, ...)."""


class InputError(Exception):
    """An input (file, log, recorded run) could not be read or is not what it should be."""
