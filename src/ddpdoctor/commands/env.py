"""`ddpdoctor env`: what this machine and environment bring to a distributed run, and what is known to
break."""

from __future__ import annotations

import argparse
import json

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ..environment import TORCH_PROBE_TIMEOUT_S, Environment, collect
from ..errors import UsageError
from ..exitcodes import FINDINGS, OK
from ..render.console import make_console

DESCRIPTION = """\
Python, torch (and its CUDA / NCCL builds), the distributed libraries, available backends, devices, the
launcher's environment variables, whether MASTER_ADDR:MASTER_PORT answers (when both are set), and
installed versions known to break distributed training.

exit codes: 0 ok, 1 a known-bad version is installed, 2 usage error"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--format", choices=("text", "json"), default="text")
    parser.add_argument(
        "--torch-timeout",
        type=float,
        default=TORCH_PROBE_TIMEOUT_S,
        metavar="SECONDS",
        help=f"give up on importing torch after this long (default {TORCH_PROBE_TIMEOUT_S:g})",
    )


def run(args: argparse.Namespace) -> int:
    if args.torch_timeout <= 0:
        raise UsageError("--torch-timeout must be positive")
    # The torch probe takes seconds; say what is happening (on a terminal only: rich shows nothing otherwise).
    with make_console(stderr=True).status("importing torch in a child process ..."):
        environment = collect(torch_timeout=args.torch_timeout)
    if args.format == "json":
        make_console(soft_wrap=True).print_json(json.dumps(environment.to_dict()))
    else:
        _render(make_console(), environment)
    return FINDINGS if environment.known_bad else OK


def _section(title: str) -> Table:
    table = Table(
        title=title, title_justify="left", title_style="bold", show_header=False, box=None, padding=(0, 2)
    )
    table.add_column(style="cyan", no_wrap=True, overflow="fold")  # a variable's name: whole
    table.add_column(overflow="fold")
    return table


def _render(console: Console, env: Environment) -> None:
    system = _section("Python and platform")
    # what this machine says (paths, versions, variables' values, errors) is text, never rich markup
    system.add_row("python", escape(f"{env.python} ({env.implementation})"))
    system.add_row("executable", escape(env.executable))
    system.add_row("platform", escape(env.platform))
    console.print(system)
    console.print()

    torch = env.torch
    info = _section("torch")
    if not torch.installed:
        info.add_row("torch", "[yellow]not installed[/] (check, explain, rules and env work without it)")
    elif torch.error:
        info.add_row("torch", f"[red]{escape(torch.error)}[/]")
    else:
        info.add_row("torch", f"{escape(torch.version or '')} (import took {torch.import_seconds:.1f} s)")
        info.add_row("CUDA build", escape(torch.cuda or "none (CPU build)"))
        if torch.cuda is not None:
            info.add_row("NCCL", escape(torch.nccl or "not available"))
        info.add_row(
            "distributed", "available" if torch.distributed else "[red]not available in this build[/]"
        )
        if torch.backends:
            info.add_row(
                "backends",
                "  ".join(
                    f"{escape(name)} [green]yes[/]" if ok else f"{escape(name)} [dim]no[/]"
                    for name, ok in torch.backends.items()
                ),
            )
        info.add_row("CUDA devices", escape("\n".join(torch.cuda_devices)) if torch.cuda_devices else "none")
        if torch.mps is not None:
            info.add_row("MPS", "available" if torch.mps else "no")
    console.print(info)
    console.print()

    packages = _section("Libraries")
    for package in env.packages:
        packages.add_row(
            escape(package.name), escape(package.version) if package.version else "[dim]not installed[/]"
        )
    console.print(packages)
    console.print()

    variables = _section("Environment variables")
    for name, value in env.variables.items():
        variables.add_row(escape(name), escape(value) if value else "[dim](empty)[/]")
    if not env.variables:
        variables.add_row("", "[dim]none of the launcher / NCCL / gloo variables is set[/]")
    console.print(variables)
    console.print()

    rendezvous = _section("Rendezvous")
    if env.rendezvous is None:
        rendezvous.add_row("MASTER_ADDR:MASTER_PORT", "[dim]not checked (both must be set)[/]")
    else:
        rv = env.rendezvous
        verdict = (
            f"[green]reachable[/] ({escape(rv.detail)})"
            if rv.reachable
            else f"[red]not reachable[/] ({escape(rv.detail)})"
        )
        rendezvous.add_row(escape(f"{rv.address}:{rv.port}"), verdict)
    console.print(rendezvous)

    for note in env.notes:
        console.print(f"[yellow]note:[/] {escape(note)}")
    console.print()

    if not env.known_bad:
        console.print("[green]No known-bad versions installed.[/]")
        return
    table = Table(title="Known-bad versions installed", title_justify="left", title_style="bold red")
    table.add_column("package", style="bold", overflow="fold")
    table.add_column("class", style="magenta", no_wrap=True, overflow="fold")
    table.add_column("when / what happens / fix", overflow="fold")
    for hit in env.known_bad:
        text = f"[bold]when:[/] {hit.entry.when}\n{hit.entry.message}"
        if hit.entry.fix:
            text += f"\n[bold]fix:[/] {hit.entry.fix}"
        table.add_row(
            escape(f"{hit.package} {hit.version}\n(bad: {hit.entry.versions})"), hit.entry.class_slug, text
        )
    console.print(table)
