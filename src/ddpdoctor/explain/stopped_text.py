"""What `explain` says about a job that stopped with no error in its log (see `stopped`): the title, the
sentences written from this log, the next commands and the fixes after them, and the facts. Display text
derived from a `JobEnd`, never parsed back."""

from __future__ import annotations

from collections.abc import Iterable

from .stopped import Ending, JobEnd, behind_rank

_GUARDED = {
    "torchrun": "torchrun <its arguments>",
    "accelerate": "accelerate launch <its arguments>",
    "Lightning": "python <your script>",
    "DeepSpeed": "deepspeed <its arguments>",
}
SHOWN_RANKS = 6  # ranks named in "Last seen" (the earliest to stop printing; a count for the rest)


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
        out.append(
            "No rank printed an error or a timeout before that: the ranks were waiting. A rank waiting in a "
            "collective that another rank never reaches looks exactly like this until the backend's "
            "timeout (10 minutes for NCCL, 30 for gloo, by default) ends it; `timeout`, a scheduler's "
            "limit or Ctrl-C came first."
        )
    elif end.ending is Ending.KILLED:
        out.append(
            "SIGKILL gives a process no chance to print anything: the kernel's OOM killer "
            "(`dmesg` or `journalctl -k` says `Out of memory: Killed process`), a scheduler's hard limit, "
            "`timeout -s KILL` or `kill -9`. If the ranks had stopped printing long before, it was a hang "
            "that was then killed."
        )
    else:
        out.append(
            "A job killed with SIGKILL (`timeout -s KILL`, `kill -9`, the OOM killer, a scheduler's hard "
            "limit) ends its log like this, and so does a job still hanging when its log was copied: a rank "
            "waiting in a collective prints nothing until the backend's timeout (10 minutes for NCCL, 30 "
            "for gloo, by default)."
        )
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
            out.append(
                f"{_ranks(silent).capitalize()} printed nothing in the log's last {end.tail_lines} lines: "
                "look there first."
            )
    elif end.last:
        out.append(
            f"The last output, at line {end.last[-1].line}: {_quoted(end.last[-1].text)}. The log does not "
            f"say which rank printed which line ({_PREFIX_HINT.get(_main_launcher(end), _PREFIX_HINT[''])})."
        )
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


def next_commands(end: JobEnd) -> str:
    """What to run next: the same job under the guard, and the checker on its script."""
    if end.command:
        command = end.command
    else:
        command = next(
            (_GUARDED[name] for name in end.launchers if name in _GUARDED), "<your launch command>"
        )
    # The whole project, not the script alone: the collective that hangs is often in a module it imports.
    where = f"`{end.script}`" if end.script else "your training script"
    guard = ("names the rank that dies and the line it dies on, or, if the job hangs, the collective and the "
             "line every rank waits at" if end.ending is Ending.KILLED else
             "names the collective and the line every rank waits at")
    return (f"Run it again under the guard, which {guard} within seconds instead of the backend's timeout: "
            f"`ddpdoctor run --hang-after 60 -- {command}`; and check the code for the usual causes first: "
            f"`ddpdoctor check .` in the project of {where}")


def other_fixes(end: JobEnd) -> tuple[str, ...]:
    """The fixes after the next commands: finding the waiting rank of a job still hanging, stopping one."""
    out = []
    if end.ending is Ending.KILLED:
        out.append("Ask the kernel whether it was the OOM killer: `dmesg -T | grep -i -e 'out of memory' -e "
                   "'killed process'` (or `journalctl -k`) on the node, at the time the job ended")
    out.append(
        "While a job hangs, see where each rank waits without stopping it: `py-spy dump --pid PID` for "
        "every rank's process; the rank that is not inside a collective is the one to fix"
    )
    out.append(
        "Stop a job that may hang with `timeout -k 30 3600 <command>` (or `ddpdoctor run --hang-after "
        "SECONDS -- <command>`, which stops every rank and says why): plain `timeout` sends only SIGTERM, "
        "which a rank stuck in a collective can ignore (Lightning's main process does)"
    )
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


__all__ = ["explain", "facts", "next_commands", "other_fixes", "title"]
