"""Exit codes shared by every subcommand (ruff's convention)."""

OK = 0  # nothing found / everything passed
FINDINGS = 1  # the tool found problems (or, for `explain`, found nothing it could diagnose)
ERROR = 2  # usage error, unreadable input, or an internal failure
