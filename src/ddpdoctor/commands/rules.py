"""`ddpdoctor rules [KEY]`: the catalogue and the rule pages in the terminal."""

from __future__ import annotations

import argparse
import json
import re

from rich.console import Console
from rich.markdown import Markdown
from rich.syntax import Syntax
from rich.table import Table
from rich.text import Text

from ..catalogue import CATALOGUE
from ..catalogue.pages import class_page
from ..check.pages import rule_page
from ..check.registry import all_rules
from ..errors import UsageError
from ..exitcodes import OK
from ..render.console import make_console

DESCRIPTION = """\
Without KEY: every failure class and its rule codes.
With KEY: one page. KEY is a class id (F4), a slug (collective-divergence) or a rule code (DDP101)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("key", nargs="?", help="class id, class slug or rule code")
    parser.add_argument("--format", choices=("text", "markdown", "json"), default="text")


def run(args: argparse.Namespace) -> int:
    rules = all_rules()
    console = make_console(soft_wrap=args.format != "text")
    if args.key is None:
        return _list(console, rules, args.format)
    key = args.key.strip()
    if key.upper() in rules:
        page = rule_page(key.upper())
        payload = {"code": key.upper(), "class": rules[key.upper()].class_slug, "page": page}
    else:
        classes = CATALOGUE.lookup(key)
        if not classes:
            raise UsageError(f"no failure class or rule named {key!r} (try `ddpdoctor rules` for the list)")
        page = "\n".join(class_page(cls) for cls in classes)
        payload = {"class": [c.slug for c in classes], "page": page}
    if args.format == "json":
        console.print_json(json.dumps(payload))
    elif args.format == "markdown":
        console.out(page, end="")
    else:
        print_page(console, page)
    return OK


_FENCE = re.compile(r"^```(?P<lexer>[\w+-]*)[^\n]*\n(?P<code>.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
CODE_THEME = "monokai"  # rich Markdown's own


def print_page(console: Console, page: str) -> None:
    """A markdown page in the terminal, its code blocks never wrapped: rich's Markdown wraps a code line at
    the terminal's width, in the middle of a statement, so code blocks are printed as they are written
    (a line longer than the terminal runs over, as `cat` shows it) and the prose between them as markdown."""
    position = 0
    for block in _FENCE.finditer(page):
        prose = page[position : block.start()]
        if prose.strip():
            console.print(Markdown(prose))
            console.print()
        _print_code(console, block.group("code").rstrip("\n"), block.group("lexer") or "text")
        console.print()
        position = block.end()
    if page[position:].strip():
        console.print(Markdown(page[position:]))


def _print_code(console: Console, code: str, lexer: str) -> None:
    longest = max((len(line) for line in code.splitlines()), default=0)
    terminal = console.width
    console.width = max(terminal, longest + 2)  # rich crops (or wraps) at the console's width: widen it
    try:
        console.print(Syntax(code, lexer, theme=CODE_THEME, word_wrap=False, padding=1, code_width=longest))
    finally:
        console.width = terminal


def _list(console: Console, rules: dict, fmt: str) -> int:
    if fmt == "json":
        data = [
            {"id": c.id, "class": c.slug, "title": c.title, "rules": [
                {"code": code, "name": rules[code].name, "summary": rules[code].summary} for code in c.rules
            ]}
            for c in CATALOGUE
        ]
        console.print_json(json.dumps(data))
        return OK
    if fmt == "markdown":
        lines = ["| id | class | title | rules |", "|---|---|---|---|"]
        for c in CATALOGUE:
            lines.append(f"| {c.id} | `{c.slug}` | {c.title} | {', '.join(c.rules) or '—'} |")
        console.out("\n".join(lines))
        return OK
    table = Table(title="ddpdoctor failure classes", title_justify="left")
    # ids, slugs and rule codes are what a reader greps for and types back: never wrapped, never cut with an
    # ellipsis (folded only on a terminal too narrow for them); a rule name goes under its code when narrow.
    table.add_column("id", style="bold", no_wrap=True, overflow="fold")
    table.add_column("class", style="cyan", no_wrap=True, overflow="fold")
    table.add_column("title", overflow="fold")
    table.add_column("rules", style="magenta", overflow="fold")
    for c in CATALOGUE:
        codes = "\n".join(f"{code} {rules[code].name}" for code in c.rules if code in rules) or "—"
        table.add_row(Text(c.id), Text(c.slug), Text(c.title), Text(codes))
    console.print(table)
    console.print("Show a page: [bold]ddpdoctor rules F4[/], [bold]ddpdoctor rules collective-divergence[/], "
                  "[bold]ddpdoctor rules DDP101[/]")
    return OK
