"""What a hung or killed job leaves in its log: it started (a launcher's banner, the ranks' output) and then
stopped, with no error anywhere.

This is the most common log of a distributed failure: a rank waits in a collective that another rank never
reaches, nothing is printed for the backend's timeout (30 minutes by default), and someone or something
ends the job first: `timeout`, the scheduler's time limit, Ctrl-C (torchrun: "Received 15 death signal,
shutting down workers"), or SIGKILL, which leaves no message at all. This module recognises the marks of
a start, of a stop from outside and of a normal end, finds the command and the script when the log shows
them, and reads the log's last lines for what each rank printed last (`stopped_text` words it). All of it
is read from the first and the last lines of each log (the scanner keeps them), never from the stream in
between: these patterns cost nothing in the per-byte search.
"""

from __future__ import annotations

import enum
import re
import shlex
import signal as _signal
from collections.abc import Iterable
from dataclasses import dataclass

from .lines import clean
from .scanner import Tail

# A distributed job started: launcher banners and the first messages of a process group. (launcher, pattern)
START_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("Lightning", re.compile(r"Initializing distributed: GLOBAL_RANK: \d+, MEMBER: \d+/\d+")),
    ("Lightning", re.compile(r"distributed_backend=\w+")),
    ("torchrun", re.compile(r"Setting OMP_NUM_THREADS environment variable for each process")),
    ("torchrun", re.compile(r"Starting elastic_operator with launch configs")),
    ("torchrun", re.compile(r"torch[/.]distributed[/.]elastic[/.]")),  # its agent's log lines, its summary
    ("accelerate", re.compile(r"The following values were not passed to `accelerate launch`")),
    ("torch.distributed", re.compile(r"Added key: store_based_barrier_key")),
    ("DeepSpeed", re.compile(r"Initializing TorchBackend in DeepSpeed")),
)

# The job was told to stop from outside. Named groups: `number` (a signal number) or `name` (SIGTERM).
STOP_PATTERNS: tuple[re.Pattern[str], ...] = (
    # torchrun's agent (torch >= 1.9): "Received 15 death signal" / "Received Signals.SIGTERM death signal"
    re.compile(r"Received (?:(?P<number>\d+)|(?:Signals\.)?(?P<name>SIG[A-Z]+)) death signal"),
    # the SignalException torchrun's agent (or accelerate's) then raises
    re.compile(r"SignalException: Process \d+ got signal: (?P<number>\d+)"),
    # Lightning's SIGTERM notifier (with INFO logging)
    re.compile(r"Received (?P<name>SIGTERM): \d+"),
    # a shell's report of its foreground job (a batch script): "line 12: 4242 Killed  python train.py"
    re.compile(r"line \d+: +\d+ (?P<shell>Killed|Terminated|Hangup|Interrupt)\b\s*(?P<command>.*)"),
    # Slurm: "*** JOB 42 ON node1 CANCELLED AT 2026-11-24T21:22:27 DUE TO TIME LIMIT ***"
    re.compile(r"CANCELLED AT (?P<cancelled>\S+)(?: DUE TO (?P<reason>[A-Z ]+?))? \*\*\*"),
    re.compile(r"KeyboardInterrupt"),
)
_SHELL_SIGNALS = {"Killed": "SIGKILL", "Terminated": "SIGTERM", "Hangup": "SIGHUP", "Interrupt": "SIGINT"}

# The job ended by itself: printed at the normal end of a process or a fit.
FINISH_PATTERNS: tuple[re.Pattern[str], ...] = (
    re.compile(r"`Trainer\.fit` stopped: "),
    re.compile(r"destroy_process_group\(\) was not called before program exit"),
)

# torchrun's failure summary names the script: "train.py FAILED"
_FAILED_SCRIPT = re.compile(r"^(?P<script>\S+\.py) FAILED\s*$")

# The command line, where a batch script traced it (`set -x`: "+ torchrun ...") or a prompt shows it.
_COMMAND_LINE = re.compile(
    r"^(?:\+{1,3}|\$)\s(?P<command>(?:\S*/)?(?:torchrun|accelerate launch|python[\d.]*|deepspeed|srun)\s.*)$"
)

# Lines that are the launcher's own, not a rank's output: torchrun's glog-style warnings, a traceback.
_LAUNCHER_LINE = re.compile(r"^[IWEF]\d{4} \d\d:\d\d:\d\d\.\d+\s+\d+ \S+:\d+\]")
_TIMESTAMP = (
    # glog (torchrun, c10d, NCCL through torch): "W1124 21:22:27.519000 ..." has no year
    re.compile(r"^[IWEF](?P<month>\d\d)(?P<day>\d\d) (?P<time>\d\d:\d\d:\d\d)"),
    # logging's and most loggers' "2026-11-24 21:22:27,123" / ISO "2026-11-24T21:22:27"
    re.compile(r"^.{0,40}?(?P<date>\d{4}-\d\d-\d\d)[T ](?P<time>\d\d:\d\d:\d\d)"),
)


class Ending(enum.Enum):
    """How the log ends."""

    STOPPED = "stopped"  # told to stop from outside (SIGTERM, SIGINT, a scheduler)
    KILLED = "killed"  # SIGKILL, as a surviving shell reports it
    FINISHED = "finished"  # a normal end was printed
    CUT_OFF = "cut-off"  # it just stops: SIGKILL leaves no message, or the job is still running


@dataclass(frozen=True)
class Mark:
    """One line that says something about the job's start or end."""

    line: int
    source: str
    text: str
    time: str | None


@dataclass(frozen=True)
class Stop:
    mark: Mark
    signal: str | None  # SIGTERM, SIGINT, SIGKILL, ... when the line names one
    detail: str  # who reports it, in words: "torchrun's agent received SIGTERM"
    command: str | None = None  # the command that was stopped, when the line says (a shell's report)


@dataclass(frozen=True)
class LastLine:
    rank: int | None
    line: int
    source: str
    text: str
    time: str | None


def timestamp(text: str) -> str | None:
    """The time a line was written, when it says (as written there: `11-24 21:22:27`, `2026-11-24
    21:22:27`)."""
    for pattern in _TIMESTAMP:
        found = pattern.match(text)
        if found:
            groups = found.groupdict()
            if "month" in groups:
                return f"{groups['month']}-{groups['day']} {groups['time']}"
            return f"{groups['date']} {groups['time']}"
    return None


def _signal_name(number: str | None, name: str | None) -> str | None:
    if name:
        return name
    if number is None:
        return None
    try:
        return _signal.Signals(int(number)).name
    except ValueError:
        return f"signal {number}"


def read_stop(text: str, mark: Mark) -> Stop | None:
    for pattern in STOP_PATTERNS:
        found = pattern.search(text)
        if not found:
            continue
        groups = found.groupdict()
        if "shell" in groups:
            command = (groups.get("command") or "").strip()
            verb = groups["shell"].lower()
            return Stop(
                mark,
                _SHELL_SIGNALS[groups["shell"]],
                f"the shell reports `{command}` {verb}" if command else f"the shell reports the job {verb}",
                command or None,
            )
        if "cancelled" in groups:
            reason = (groups.get("reason") or "").strip().lower()
            when = mark.time or timestamp(groups["cancelled"].replace("T", " ")) or groups["cancelled"]
            return Stop(Mark(mark.line, mark.source, mark.text, when), "SIGTERM",
                        "Slurm cancelled the job" + (f" ({reason})" if reason else ""))
        if pattern.pattern == "KeyboardInterrupt":
            return Stop(mark, "SIGINT", "it got a KeyboardInterrupt (Ctrl-C or SIGINT)")
        sig = _signal_name(groups.get("number"), groups.get("name"))
        who = (
            "torchrun's agent" if "death signal" in pattern.pattern or "SignalException" in text else "a rank"
        )
        if "Received SIGTERM:" in text:
            who = "Lightning"
        return Stop(mark, sig, f"{who} received {sig}")
    return None


def read_command(text: str) -> str | None:
    found = _COMMAND_LINE.match(text.strip())
    return found.group("command").strip() if found else None


def script_of(command: str) -> str | None:
    """The Python script a launch command runs (its first `*.py` argument)."""
    try:
        words = shlex.split(command)
    except ValueError:
        words = command.split()
    return next((w for w in words if w.endswith(".py") and not w.startswith("-")), None)


def failed_script(text: str) -> str | None:
    found = _FAILED_SCRIPT.match(text)
    return found.group("script") if found else None


def launcher_of(command: str) -> str | None:
    """The distributed launcher a command line starts, if it is one."""
    for name, launcher in (("torchrun", "torchrun"), ("torch.distributed.run", "torchrun"),
                           ("torch.distributed.launch", "torchrun"), ("accelerate launch", "accelerate"),
                           ("deepspeed", "DeepSpeed"), ("srun", "Slurm")):
        if name in command:
            return launcher
    return None


def finished(text: str) -> bool:
    return any(p.search(text) for p in FINISH_PATTERNS)


def last_lines(tails: Iterable[Tail], stop_lines: dict[str, int], source_ranks: dict[str, int | None]
               ) -> list[LastLine]:
    """The last line each rank printed before the job was stopped (one entry per rank, `rank=None` for the
    last lines that name no rank), oldest first. Launcher lines and everything from the stop on are not
    the ranks' output."""
    found: dict[int | None, LastLine] = {}
    unranked: list[LastLine] = []
    for tail in tails:
        end = stop_lines.get(tail.source)
        in_traceback = False
        for offset, raw in enumerate(tail.lines):
            number = tail.first_line + offset
            if end is not None and number >= end:
                break
            rank, text = clean(raw)
            if rank is None:
                rank = source_ranks.get(tail.source)
            stripped = text.strip()
            if not stripped or _LAUNCHER_LINE.match(stripped) or read_command(stripped):
                continue
            if stripped.startswith("Traceback (most recent call last)"):
                in_traceback = True  # the launcher's own traceback after the stop: not a rank's output
            if in_traceback and rank is None:
                continue
            entry = LastLine(rank, number, tail.source, stripped, timestamp(stripped))
            if rank is None:
                unranked.append(entry)
            else:
                found[rank] = entry
    out = list(found.values())
    if not out:
        out = unranked[-2:]
    return sorted(out, key=lambda e: (e.source, e.line))


@dataclass(frozen=True)
class JobEnd:
    """How a distributed job's log ends when no failure message explains it."""

    launchers: tuple[str, ...]  # what the log shows started it (torchrun, Lightning, accelerate, ...)
    ending: Ending
    stop: Stop | None  # the first mark of a stop from outside (STOPPED, KILLED)
    finish: Mark | None  # the mark of a normal end (FINISHED)
    command: str | None  # the launch command, when the log shows it
    script: str | None  # the training script, from the command
    last: tuple[LastLine, ...]  # what each rank printed last, oldest first
    ranks: tuple[int, ...]  # every rank the log shows
    tail_lines: int  # how many of the log's last lines `last` was read from


SLUG = {
    Ending.STOPPED: "collective-timeout",
    Ending.CUT_OFF: "collective-timeout",
    Ending.KILLED: "dead-rank",
}
CONFIDENCE = {
    Ending.STOPPED: 0.5,
    Ending.KILLED: 0.45,
    Ending.CUT_OFF: 0.35,
}  # no error in the log: never sure


def behind_rank(end: JobEnd) -> LastLine | None:
    """The rank whose output stopped well before every other rank's (they printed more than a line each
    after it), if one did."""
    ranked = [e for e in end.last if e.rank is not None]
    if (
        len(ranked) >= 2
        and ranked[0].source == ranked[1].source
        and ranked[1].line - ranked[0].line > len(ranked)
    ):
        return ranked[0]
    return None


__all__ = [
    "CONFIDENCE",
    "FINISH_PATTERNS",
    "SLUG",
    "START_PATTERNS",
    "STOP_PATTERNS",
    "Ending",
    "JobEnd",
    "LastLine",
    "Mark",
    "Stop",
    "behind_rank",
    "failed_script",
    "finished",
    "last_lines",
    "launcher_of",
    "read_command",
    "read_stop",
    "script_of",
    "timestamp",
]
