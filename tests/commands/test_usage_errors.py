"""The `ddpdoctor` command line itself: usage errors name the subcommand they belong to."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize("subcommand, arguments", [("check", ["."]), ("explain", ["train.log"]), ("run", []),
                                                    ("rules", [])])
def test_a_wrong_flag_on_a_subcommand_prints_that_subcommands_usage(cli, subcommand: str,
                                                                    arguments: list[str]) -> None:
    result = cli(subcommand, *arguments, "--no-such-flag")
    assert result.returncode == 2
    first = result.stderr.splitlines()[0]
    assert first.startswith(f"Usage: ddpdoctor {subcommand} "), result.stderr
    assert f"ddpdoctor {subcommand}: error: unrecognized arguments: --no-such-flag" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_wrong_flag_before_any_subcommand_prints_the_top_level_usage(cli) -> None:
    result = cli("--no-such-flag")
    assert result.returncode == 2
    assert result.stderr.startswith("Usage: ddpdoctor [-h]") and "COMMAND" in result.stderr.splitlines()[0]
