"""Moved: explain's output is rendered in `ddpdoctor.render` (`explain_text`, `explain_markdown`, and the
formats every report has), from the Findings `explain.report` makes. Only `fixes` is left here, for the
demo (commands/demo.py), until it imports it from `explain.report`."""

from __future__ import annotations

from .report import fixes

__all__ = ["fixes"]
