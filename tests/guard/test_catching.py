"""Whether the program catches a failing collective's error: read from the source of the caller's frames."""

from __future__ import annotations

import sys
import unittest

import pytest

from ddpdoctor.guard.rank.catching import caught_by_program


def collective() -> bool:
    """Stands for the guarded call: what the guard asks, from the collective's caller outward."""
    return caught_by_program(sys._getframe(1))


def test_a_try_whose_handler_names_the_error_catches_it() -> None:
    try:
        answer = collective()
    except RuntimeError:
        answer = False
    assert answer


def test_a_handler_that_raises_again_or_names_another_error_does_not() -> None:
    try:
        again = collective()
    except RuntimeError:
        raise
    try:
        other = collective()
    except (ValueError, KeyError):
        other = True
    assert not again and not other


def test_no_handler_at_all_is_not_catching() -> None:
    assert not collective()


def test_a_caller_further_out_that_catches_counts() -> None:
    def step() -> bool:
        return collective()

    try:
        answer = step()
    except Exception:  # noqa: BLE001 - what is tested
        answer = False
    assert answer


def test_expecting_the_error_with_pytest_raises_counts() -> None:
    seen = []
    with pytest.raises(RuntimeError):
        seen.append(collective())
        raise RuntimeError
    with pytest.raises(AssertionError):  # expects another error: the collective's is not caught
        seen.append(collective())
        raise AssertionError
    assert seen == [True, False]


class Expecting(unittest.TestCase):
    """torch's own tests expect the error with assertRaisesRegex; unittest's catch-all around a test does
    not count (the walk stops at the runner's frames)."""

    def test_assert_raises(self) -> None:
        seen = []
        with self.assertRaisesRegex(RuntimeError, "x"):
            seen.append(collective())
            raise RuntimeError("x")
        self.assertEqual(seen, [True])

    def test_the_runners_catch_all_does_not(self) -> None:
        self.assertFalse(collective())
