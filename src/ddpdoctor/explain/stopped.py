"""What a hung or killed job leaves in its log: it started (a launcher's banner, the ranks' output) and then
stopped, with no error anywhere.

This is the most common log of a distributed failure: a rank waits in a collective that another rank never
reaches, nothing is printed for the backend's timeout (30 minutes by default), and someone or something
ends the job first: `timeout`, the scheduler's time limit, Ctrl-C (torchrun: "Received 15 death signal,
shutting down workers"), or SIGKILL, which leaves no message at all. This module recognises the marks of
a start, of a stop from outside and of a normal end, finds the command and the script when the log shows
them, and reads the log's last lines for what each rank printed last. All of it is read from the first and
the last lines of each log (the scanner keeps them), never from the stream in between: these patterns
cost nothing in the per-byte search.
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
    """The time a line was written, when it says (as written there: `11-24 21:22:27`, `2026-11-24 21:22:27`)."""
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
            return Stop(mark, _SHELL_SIGNALS[groups["shell"]],
                        f"the shell reports `{command}` {verb}" if command else f"the shell reports the job {verb}",
                        command or None)
        if "cancelled" in groups:
            reason = (groups.get("reason") or "").strip().lower()
            when = mark.time or timestamp(groups["cancelled"].replace("T", " ")) or groups["cancelled"]
            return Stop(Mark(mark.line, mark.source, mark.text, when), "SIGTERM",
                        "Slurm cancelled the job" + (f" ({reason})" if reason else ""))
        if pattern.pattern == "KeyboardInterrupt":
            return Stop(mark, "SIGINT", "it got a KeyboardInterrupt (Ctrl-C or SIGINT)")
        sig = _signal_name(groups.get("number"), groups.get("name"))
        who = "torchrun's agent" if "death signal" in pattern.pattern or "SignalException" in text else "a rank"
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


_GUARDED = {
    "torchrun": "torchrun <its arguments>",
    "accelerate": "accelerate launch <its arguments>",
    "Lightning": "python <your script>",
    "DeepSpeed": "deepspeed <its arguments>",
}
SHOWN_RANKS = 6  # ranks named in "Last seen" (the earliest to stop printing; a count for the rest)
CONFIDENCE = {Ending.STOPPED: 0.5, Ending.KILLED: 0.45, Ending.CUT_OFF: 0.35}
SLUG = {Ending.STOPPED: "collective-timeout", Ending.CUT_OFF: "collective-timeout", Ending.KILLED: "dead-rank"}


def title(end: JobEnd) -> str:
    if end.ending is Ending.KILLED:
        return "The job was killed (SIGKILL) without printing an error"
    if end.ending is Ending.STOPPED:
        return "The job was stopped while no rank reported an error: most likely a hang"
    return "The log stops with no error and no exit status: most likely a hang"


def _quoted(text: str, limit: int = 120) -> str:
    text = text if len(text) <= limit else text[: limit - 1] + "…"
    return "`" + text.replace("`", "'") + "`"


def _ranks(values: Iterable[int]) -> str:
    items = sorted(set(values))
    return ("rank " if len(items) == 1 else "ranks ") + ", ".join(map(str, items))


def explain(end: JobEnd) -> list[str]:
    """What happened, in sentences written from this log."""
    started = " and ".join(end.launchers) if end.launchers else "the launcher"
    size = f", {len(end.ranks)} ranks" if len(end.ranks) > 1 else ""
    out = []
    if end.stop is not None:
        when = f" at {end.stop.mark.time}" if end.stop.mark.time else ""
        out.append(f"The job started ({started}{size}) and then {end.stop.detail}{when} "
                   f"(line {end.stop.mark.line}).")
    else:
        out.append(f"The job started ({started}{size}) and then its output ends: no error, no stop message, "
                   "no exit status.")
    if end.ending is Ending.STOPPED:
        out.append("No rank printed an error or a timeout before that: the ranks were waiting. A rank waiting in a "
                   "collective that another rank never reaches looks exactly like this until the backend's "
                   "timeout (10 minutes for NCCL, 30 for gloo, by default) ends it; `timeout`, a scheduler's "
                   "limit or Ctrl-C came first.")
    elif end.ending is Ending.KILLED:
        out.append("SIGKILL gives a process no chance to print anything: the kernel's OOM killer "
                   "(`dmesg` or `journalctl -k` says `Out of memory: Killed process`), a scheduler's hard limit, "
                   "`timeout -s KILL` or `kill -9`. If the ranks had stopped printing long before, it was a hang "
                   "that was then killed.")
    else:
        out.append("A job killed with SIGKILL (`timeout -s KILL`, `kill -9`, the OOM killer, a scheduler's hard "
                   "limit) ends its log like this, and so does a job still hanging when its log was copied: a rank "
                   "waiting in a collective prints nothing until the backend's timeout (10 minutes for NCCL, 30 "
                   "for gloo, by default).")
    ranked = [e for e in end.last if e.rank is not None]
    if ranked:
        # oldest first: the ranks that stopped printing first are the ones to look at
        shown = ranked if len(ranked) <= SHOWN_RANKS else ranked[: SHOWN_RANKS - 1]
        seen = "; ".join(f"rank {e.rank} at line {e.line}: {_quoted(e.text)}" for e in shown)
        if len(shown) < len(ranked):
            latest = ranked[-1]
            seen += (f"; {len(ranked) - len(shown)} more ranks later, the last rank {latest.rank} at line "
                     f"{latest.line}")
        out.append(f"Last seen: {seen}.")
        behind = behind_rank(end)
        if behind is not None:
            out.append(f"Rank {behind.rank} stopped printing first: the other ranks went on for "
                       f"{ranked[1].line - behind.line} more lines. It is the one to look at: busy or stuck "
                       "outside the collective the others wait in.")
        silent = sorted(set(end.ranks) - {e.rank for e in ranked if e.rank is not None})
        if silent:
            out.append(f"{_ranks(silent).capitalize()} printed nothing in the log's last {end.tail_lines} lines: "
                       "look there first.")
    elif end.last:
        out.append(f"The last output, at line {end.last[-1].line}: {_quoted(end.last[-1].text)}. The log does not "
                   f"say which rank printed which line ({_PREFIX_HINT.get(_main_launcher(end), _PREFIX_HINT[''])}).")
    times = [e.time for e in end.last if e.time]
    if times:
        out.append(f"The last output with a time was written at {times[-1]}.")
    return out


_PREFIX_HINT = {
    "torchrun": "torchrun's `--tee 3` prefixes every line with its rank",
    "accelerate": "`accelerate launch --tee 3` prefixes every line with its rank",
    "Lightning": "put `self.global_rank` in what the module prints",
    "": "print each rank's number with its messages",
}


def _main_launcher(end: JobEnd) -> str:
    return next((name for name in end.launchers if name in _PREFIX_HINT), "")


def behind_rank(end: JobEnd) -> LastLine | None:
    """The rank whose output stopped well before every other rank's (they printed more than a line each
    after it), if one did."""
    ranked = [e for e in end.last if e.rank is not None]
    if len(ranked) >= 2 and ranked[0].source == ranked[1].source and ranked[1].line - ranked[0].line > len(ranked):
        return ranked[0]
    return None


def next_commands(end: JobEnd) -> str:
    """What to run next: the same job under the guard, and the checker on its script."""
    if end.command:
        command = end.command
    else:
        command = next((_GUARDED[name] for name in end.launchers if name in _GUARDED), "<your launch command>")
    check = end.script or "<your training script>"
    guard = ("names the rank that dies and the line it dies on, or, if the job hangs, the collective and the "
             "line every rank waits at" if end.ending is Ending.KILLED else
             "names the collective and the line every rank waits at")
    return (f"Run it again under the guard, which {guard} within seconds instead of the backend's timeout: "
            f"`ddpdoctor run --hang-after 60 -- {command}`; and check the script for the usual causes first: "
            f"`ddpdoctor check {check}`")


def other_fixes(end: JobEnd) -> tuple[str, ...]:
    """The fixes after the next commands: finding the waiting rank of a job still hanging, stopping one."""
    out = []
    if end.ending is Ending.KILLED:
        out.append("Ask the kernel whether it was the OOM killer: `dmesg -T | grep -i -e 'out of memory' -e "
                   "'killed process'` (or `journalctl -k`) on the node, at the time the job ended")
    out.append("While a job hangs, see where each rank waits without stopping it: `py-spy dump --pid PID` for "
               "every rank's process; the rank that is not inside a collective is the one to fix")
    out.append("Stop a job that may hang with `timeout -k 30 3600 <command>` (or `ddpdoctor run --hang-after "
               "SECONDS -- <command>`, which stops every rank and says why): plain `timeout` sends only SIGTERM, "
               "which a rank stuck in a collective can ignore (Lightning's main process does)")
    return tuple(out)


def facts(end: JobEnd) -> dict[str, object]:
    out: dict[str, object] = {"ending": end.ending.value}
    if end.launchers:
        out["launcher"] = ", ".join(end.launchers)
    if end.ranks:
        out["ranks"] = list(end.ranks)
    ranked = {e.rank for e in end.last if e.rank is not None}
    if ranked and set(end.ranks) - ranked:
        out["silent_ranks"] = sorted(set(end.ranks) - ranked)
    behind = behind_rank(end)
    if behind is not None:
        out["stopped_printing_first"] = behind.rank
    if end.stop is not None:
        if end.stop.signal:
            out["stopped_by"] = end.stop.signal
        if end.stop.mark.time:
            out["stopped_at"] = end.stop.mark.time
    times = [e.time for e in end.last if e.time]
    if times:
        out["last_output_at"] = times[-1]
    if end.command:
        out["command"] = end.command
    if end.script:
        out["script"] = end.script
    return out


__all__ = [
    "CONFIDENCE",
    "SLUG",
    "JobEnd",
    "explain",
    "behind_rank",
    "facts",
    "other_fixes",
    "next_commands",
    "title",
    "FINISH_PATTERNS",
    "START_PATTERNS",
    "STOP_PATTERNS",
    "Ending",
    "LastLine",
    "Mark",
    "Stop",
    "failed_script",
    "finished",
    "launcher_of",
    "last_lines",
    "read_command",
    "read_stop",
    "script_of",
    "timestamp",
]
