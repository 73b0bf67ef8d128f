"""Distributed errors outside the catalogue: the first one in the log, its rank, and what it means.

The catalogue's classes are the failures ddpdoctor knows how to fix at their root. A log often shows another
distributed error instead: NCCL refusing two ranks on one GPU, a rank asking for a GPU its machine does not
have, DDP refusing a module spread over devices, a launcher's argument the script does not accept. For
those `explain` still names the first occurrence, its rank and, where torch's or NCCL's source makes the
meaning plain, what the message means and the usual fix, at a modest confidence (`KNOWN`). Any other error
of a distributed job (a Python exception on a rank, a native abort, a non-zero exit the launcher reports) is
named as the job's first failure, with no claim about its cause (`first_failure`).

Both are reported as the class `distributed-error`, with the fact `error` naming what it is.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..catalogue import CATALOGUE, FailureClass
from ..findings import Evidence, Finding, Fix, Location, Severity
from .knowledge import ClassKnowledge

SLUG = "distributed-error"
KNOWN_CONFIDENCE = 0.65
UNKNOWN_CONFIDENCE = 0.4  # the first failure of a distributed job, cause not known


@dataclass(frozen=True)
class KnownError:
    name: str  # the `error` fact
    pattern: re.Pattern[str]  # each alternative starts with 4+ literal characters (a trigger anchor)
    meaning: str  # a template over the facts
    fix: str


def _known(name: str, pattern: str, meaning: str, fix: str) -> KnownError:
    return KnownError(name, re.compile(pattern), meaning, fix)


# Most specific first: when several are in the log, the first listed names it (NCCL's `ncclInvalidUsage`
# line comes before the `Duplicate GPU detected` that says why).
KNOWN = (
    _known(
        "duplicate-gpu",
        r"Duplicate GPU detected ?: rank (?P<rank_a>\d+) and rank (?P<rank_b>\d+) both on CUDA device "
        r"(?P<bus_id>\w+)",
        "NCCL found two ranks on one GPU (ranks {rank_a} and {rank_b}, device {bus_id}) and refused to build "
        "the communicator: NCCL needs one GPU per rank.",
        "Give every process its own GPU: `torch.cuda.set_device(int(os.environ['LOCAL_RANK']))` before the "
        "first collective (and `device_ids=[local_rank]` for DDP); look for a device hard-coded in the "
        "script "
        "(`cuda:0`, `CUDA_VISIBLE_DEVICES` set inside it) and start at most as many processes per node as it "
        "has GPUs",
    ),
    _known(
        "invalid-device-ordinal",
        r"invalid device ordinal",
        "A rank asked for a CUDA device its machine does not have: the device index (usually the local "
        "rank) is "
        "at least the number of GPUs visible to that process.",
        "Start at most as many processes per node as it has visible GPUs (`--nproc-per-node` against "
        "`CUDA_VISIBLE_DEVICES` / `nvidia-smi`), and index devices by the local rank (`LOCAL_RANK`), not the "
        "global rank",
    ),
    _known(
        "local-rank-argument",
        r"error: unrecognized arguments: (?P<argument>--local[-_]rank\S*)",
        "The launcher passed `{argument}` on the command line (`torch.distributed.launch` does; since "
        "torch 2.0 "
        "it spells it `--local-rank`) and the script's argument parser does not accept it, so every rank "
        "exited at start-up.",
        "Accept both spellings (`parser.add_argument('--local-rank', '--local_rank', type=int, "
        "default=int(os.environ.get('LOCAL_RANK', 0)))`), or launch with `torchrun` and read "
        "`LOCAL_RANK` from "
        "the environment",
    ),
    _known(
        "ddp-device-ids",
        r"device_ids can only be None or contain a single element",
        "DistributedDataParallel was given several device ids: it drives one device per process.",
        "Pass one device per process: `DDP(model, device_ids=[local_rank])`, one process per GPU",
    ),
    _known(
        "ddp-module-devices",
        r"DistributedDataParallel device_ids and output_device arguments only work with single-device",
        "DistributedDataParallel refused a module whose parameters are not all on the one device given in "
        "`device_ids` (a module spread over several GPUs, or left on another device).",
        "Move the module to this rank's device before wrapping it (`model.to(local_rank)`), or, for a module "
        "spread over GPUs on purpose, wrap it with `device_ids=None`",
    ),
    _known(
        "address-in-use",
        r"EADDRINUSE|ddress already in use",
        "The rendezvous port is taken: another job, or an earlier run still alive, listens on MASTER_PORT.",
        "Pick a free port (`--master-port`, `MASTER_PORT`, `--rdzv-endpoint`) or end the job that holds it",
    ),
    _known(
        "init-twice",
        r"trying to initialize the default process group twice",
        "`init_process_group` was called a second time in one process (a library or a launcher already did).",
        "Call `init_process_group` once; check `dist.is_initialized()` first when a framework may have "
        "done it",
    ),
    _known(
        "cuda-in-forked-process",
        r"Cannot re-initialize CUDA in forked subprocess",
        "CUDA was initialised before the worker processes were forked; a forked child cannot use it.",
        "Start workers with the `spawn` start method (`mp.spawn`, `torchrun`), and do not touch CUDA before",
    ),
    _known(
        "nccl-invalid-usage",
        r"invalid usage|ncclInvalidUsage",
        "NCCL reported invalid usage: most often two ranks on one GPU (more processes per node than GPUs, or "
        "a device not chosen by the local rank); `NCCL_DEBUG=WARN` prints the precise reason.",
        "Rerun with `NCCL_DEBUG=WARN`; check one process per GPU (`--nproc-per-node` against the "
        "visible GPUs, "
        "`torch.cuda.set_device(local_rank)`)",
    ),
    _known(
        "nccl-system-error",
        r"unhandled system error|ncclSystemError",
        "NCCL failed in a system call or lost a peer (sockets, shared memory, a process that exited); "
        "`NCCL_DEBUG=WARN` prints which.",
        "Rerun with `NCCL_DEBUG=WARN` (and `NCCL_DEBUG_SUBSYS=INIT,NET`); check the network interface "
        "(`NCCL_SOCKET_IFNAME`), shared memory (`/dev/shm` in containers) and whether a peer exited first",
    ),
    _known(
        "nccl-cuda-error",
        r"unhandled cuda error|ncclUnhandledCudaError",
        "A CUDA call inside NCCL failed (a driver/runtime mismatch, peer-to-peer access the machine does not "
        "support, a GPU fault); `NCCL_DEBUG=WARN` prints which.",
        "Rerun with `NCCL_DEBUG=WARN`; try `NCCL_P2P_DISABLE=1` to test peer-to-peer access, and check the "
        "driver against torch's CUDA version",
    ),
)
# Each pattern searched in every block costs throughput (about 1 % each): most known errors are read from an
# exception line (`...Error: `, which the knowledge base searches for anyway) or the lines after it. Searched
# on their own: those that users paste without their exception line, or that come without one.
_SEARCHED = ("local-rank-argument", "duplicate-gpu")
PATTERNS = tuple(k.pattern for k in KNOWN if k.name in _SEARCHED)
AFTER = 4  # lines after an exception line that still belong to its message

# A line that is an exception message (the last line of a traceback), a native abort, an argparse error.
_EXCEPTION_LINE = re.compile(
    r"^\s*(?P<exception>(?:[\w.]+\.)?\w*(?:Error|Exception|Interrupt)):\s?(?P<message>.{0,300})"
)
# A process that died in native code, as the shell or the C++ runtime reports it (read from the log's last
# lines, where it ends, at no cost per byte).
_NATIVE_END = re.compile(
    r"(?P<native>Aborted|Segmentation fault|Bus error|Floating point exception)(?: \(core dumped\))?\s*$|"
    r"terminate called after throwing an instance of"
)
# the launcher reporting a failure, or a stop from outside (stopped.py reads those): not a failure of a rank
_NOT_A_FAILURE = re.compile(r"ChildFailedError|SignalException|KeyboardInterrupt")
_DISTRIBUTED = re.compile(r"c10d|NCCL|nccl|[Gg]loo|elastic|torch\.distributed|ProcessGroup|Dist\w*Error")


@dataclass(frozen=True)
class ErrorHit:
    known: KnownError | None
    text: str
    rank: int | None
    line: int
    source: str
    order: int  # the order the log was read in: sources, then lines
    facts: dict[str, Any] = field(default_factory=dict)
    fatal: bool = True  # its rank printed nothing after it but the rest of the traceback: it died of it


class FirstErrors:
    """Collects the known errors and the exception lines of one job's logs as the scanner finds them."""

    def __init__(self) -> None:
        self.known: list[ErrorHit] = []
        self.exceptions: list[ErrorHit] = []
        self._order = 0

    def add(self, text: str, rank: int | None, line: int, source: str, after: Sequence[str] = (),
            fatal: bool = True) -> None:
        """A line the scanner found (and the lines of its rank after it; `fatal`: nothing but traceback)."""
        self._order += 1
        for known in KNOWN:
            found = next(filter(None, (known.pattern.search(t) for t in (text, *after[:AFTER]))), None)
            if found:
                facts: dict[str, Any] = {k: int(v) if k.startswith("rank") else v
                                         for k, v in found.groupdict().items() if v is not None}
                self.known.append(ErrorHit(known, text, rank, line, source, self._order, facts))
                return
        exception = _EXCEPTION_LINE.match(text)
        if exception and not _NOT_A_FAILURE.search(text) and len(self.exceptions) < 50:
            facts = {"exception": exception.group("exception").rsplit(".", 1)[-1]}
            self.exceptions.append(ErrorHit(None, text, rank, line, source, self._order, facts, fatal))

    def native_end(self, source: str, first_line: int, lines: Sequence[str], rank: int | None) -> None:
        """A native crash in the last lines of a log (shell's `Aborted (core dumped)`, C++'s terminate)."""
        for offset, raw in enumerate(lines):
            found = _NATIVE_END.search(raw)
            if found:
                kind = (found.group("native") or "Aborted").lower().replace(" ", "-")
                self._order += 1
                self.exceptions.append(ErrorHit(None, raw.strip(), rank, first_line + offset, source,
                                                self._order, {"exception": f"native {kind}"}))
                return

    def first_known(self) -> ErrorHit | None:
        if not self.known:
            return None
        priority = {known.name: i for i, known in enumerate(KNOWN)}
        assert all(h.known is not None for h in self.known)
        return min(self.known, key=lambda h: (priority[h.known.name if h.known else ""], h.order))

    def first_distributed_exception(self, distributed_job: bool, fatal_only: bool = False) -> ErrorHit | None:
        """The first exception line of a distributed job (or one that names torch.distributed itself); with
        `fatal_only`, the first one its rank died of."""
        for hit in sorted(self.exceptions, key=lambda h: h.order):
            if fatal_only and not hit.fatal:
                continue
            if distributed_job or _DISTRIBUTED.search(hit.text):
                return hit
        return None


def launcher_exit(rank: int | None, exitcode: int, line: int, source: str) -> ErrorHit:
    """The first failure as only the launcher reports it: a rank that exited with an error status."""
    who = f"rank {rank}" if rank is not None else "a rank"
    text = (f"{who} exited with status {exitcode} (the launcher's report; the rank's own error is not in "
            "the log)")
    return ErrorHit(None, text, rank, line, source, 0, {"exception": f"exit status {exitcode}"})


def failure_class() -> FailureClass:
    if SLUG in CATALOGUE:
        return CATALOGUE.get(SLUG)
    return FailureClass(
        id="", slug=SLUG, title="A distributed error outside ddpdoctor's catalogue",
        summary="The first error of the job, named with its rank; not one of the catalogue's classes.",
        symptoms=(), why="", rules=(), references=(),
        fixes=(
            "Read the first error and its rank (the other ranks' errors usually follow from it)",
            "Rerun under `ddpdoctor run -- <your command>` to have every rank's state recorded when it fails",
        ),
    )


def knowledge() -> ClassKnowledge:
    return ClassKnowledge(failure_class(), (), (), ())


def finding(hit: ErrorHit, confidence: float, first_exit: dict[str, Any], where: Location | None) -> Finding:
    """The finding for the first known error (or first failure) `hit`."""
    facts: dict[str, Any] = dict(hit.facts)
    facts.update(first_exit)
    text = hit.text if len(hit.text) <= 400 else hit.text[:400] + " …"
    facts["first_error"] = text
    if hit.rank is not None:
        facts["rank"] = hit.rank
    if hit.known is not None:
        facts["error"] = hit.known.name
        message = _fill(hit.known.meaning, facts)
        fix = _fill(hit.known.fix, facts)
    else:
        facts["error"] = "first-failure"
        said = f"rank {hit.rank}" if hit.rank is not None else "a rank"
        exception = str(facts.get("exception", "an error"))
        if exception.startswith("native"):
            message = f"The job's first error: {said} ended in native code (`{text}`)"
        else:
            message = f"The job's first error: {said} failed with `{exception}`"
        fix = ("Fix the first error: the messages of the other ranks (timeouts, lost connections, SIGTERM "
               "from "
               "the launcher) follow from it")
    return Finding(
        class_=SLUG, message=message, severity=Severity.ERROR, fix=Fix(message=fix),
        evidence=(Evidence(text=text, line=hit.line, rank=hit.rank),), facts=facts,
        confidence=round(confidence, 2), locations=(where,) if where is not None else (),
    )


def explanation(hit: ErrorHit, facts: dict[str, Any]) -> list[str]:
    where = f"rank {hit.rank}" if hit.rank is not None else "the log"
    first = f"The first distributed error in {where} (line {hit.line}): `{facts['first_error']}`."
    if hit.known is None:
        return [first, "It is not one of the failures ddpdoctor's catalogue explains; the errors after it on "
                       "other ranks are most likely its consequences."]
    return [first, _fill(hit.known.meaning, facts)]


def _fill(template: str, facts: dict[str, Any]) -> str:
    try:
        return template.format(**facts)
    except (KeyError, IndexError, ValueError):
        return re.sub(r"\s*\([^()]*\{\w+\}[^()]*\)|`?\{\w+\}`?", "", template)
