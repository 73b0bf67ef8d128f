"""Deciding, from every rank's record, whether the job is stuck and why. Pure functions.

`decide` takes the ranks' `RankRecord`s (model.py) and returns a `Verdict`, whose `Decision` says what
was concluded (the way torch's Flight Recorder analyser names its match states); the headline and the
report's rows are derived from it. A waiting rank is judged by `RULES`, in order, each a function of one
`Waiter`; the first that decides wins. To add a decision: a `Decision` member (with its class in
`_CLASS_OF`), a rule function in `RULES` at the place its priority calls for, and its advice in the
catalogue's `[guard.advice]` table of its class (see `ddpdoctor/advice.py`).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, replace
from typing import Any

from ...advice import advice, class_references
from ...findings import Evidence, Finding, Fix, Location, Severity
from ...records import CallRecord, MetricOrigin, RankRecord, RankState, RankStatus
from ..fingerprint import P2P_OPS, describe, differences
from .checkpoints import Checkpoint, first_difference
from .long_section import SLUG as ALONE_SLUG
from .long_section import alone_headline, alone_peers, progress_unknown
from .places import in_backward, in_compiled_graph, location_of, user_line, where
from .rank_branch import RankBranch, rank_branch
from .rank_rows import RankRow, died_at, died_of_a_failed_collective, fatal_signal, how_it_ended, rank_row
from .sharded_steps import SLUG as SHARDED_SLUG
from .sharded_steps import pass_difference

_FIELD_WORDS = {"op": "op", "shapes": "shape", "dtypes": "dtype", "reduce_op": "ReduceOp", "root": "root",
                "metric": "metric"}


class Decision(str, enum.Enum):
    """What the judge concluded; the value is the finding's `facts["kind"]`."""

    COMPLETED_MISMATCH = "completed-mismatch"  # an earlier call both ranks passed, with different arguments
    MISMATCH = "mismatch"  # the same (group, seq), another op / shape / dtype / ReduceOp / root / metric
    PASSED_OUTSIDE_PYTHON = "passed"  # a peer past this seq through a collective issued from C++
    PEER_DEAD = "dead"  # a peer died while this rank waits
    PEER_EXITED = "exited"  # a peer finished without making this call
    ALL_STUCK = "stuck"  # every rank in the call, none completes it
    PEERS_ELSEWHERE = "elsewhere"  # peers running elsewhere, past --hang-after
    PEER_IN_OTHER_COLLECTIVE = "in-other-collective"  # a peer waits in another collective, past --hang-after
    PEER_ALONE = "alone"  # the call failed (the group's timeout) while the peers outside it were running
    SHARDED_STEPS = "sharded-steps"  # explained by a sharded model's differing forward counts
    DIED_FIRST = (
        "died-first"  # nobody waited, but one rank died silently before the launcher stopped the rest
    )
    RAISED_FIRST = "raised-first"  # nobody waited, but one rank died of an uncaught exception before the rest

    @property
    def class_(self) -> str:
        return _CLASS_OF[self]

    @property
    def weak(self) -> bool:
        """Decided from peers "elsewhere": right after a connection broke, a peer may be dying this very
        moment (a SIGKILLed process closes its sockets before it is a zombie), so a post-mortem waits a
        little for a stronger decision."""
        return self in (Decision.ALL_STUCK, Decision.PEERS_ELSEWHERE, Decision.PEER_IN_OTHER_COLLECTIVE,
                        Decision.PEER_ALONE)


_DIVERGENCE, _TIMEOUT, _DEAD = "collective-divergence", "collective-timeout", "dead-rank"
_CLASS_OF = {
    Decision.COMPLETED_MISMATCH: _DIVERGENCE, Decision.MISMATCH: _DIVERGENCE,
    Decision.PASSED_OUTSIDE_PYTHON: _DIVERGENCE, Decision.PEER_EXITED: _DIVERGENCE,
    Decision.PEER_IN_OTHER_COLLECTIVE: _DIVERGENCE, Decision.PEER_DEAD: _DEAD, Decision.DIED_FIRST: _DEAD,
    Decision.RAISED_FIRST: _DEAD,
    Decision.ALL_STUCK: _TIMEOUT, Decision.PEERS_ELSEWHERE: _TIMEOUT, Decision.PEER_ALONE: ALONE_SLUG,
    Decision.SHARDED_STEPS: SHARDED_SLUG,
}
# the facts key a decision names its peers under (docs/guard.md)
_PEERS_KEY = {Decision.PEER_DEAD: "dead", Decision.DIED_FIRST: "dead", Decision.RAISED_FIRST: "dead",
              Decision.PEER_EXITED: "missing",
              Decision.PEERS_ELSEWHERE: "absent", Decision.PEER_IN_OTHER_COLLECTIVE: "absent",
              Decision.PASSED_OUTSIDE_PYTHON: "peer", Decision.PEER_ALONE: "alone"}


@dataclass(frozen=True)
class Verdict:
    decision: Decision
    headline: str
    rows: Mapping[int, RankRow]
    group: str | None = None
    seq: int | None = None
    mismatch: tuple[str, ...] = ()  # the differing fields, for the mismatch decisions
    peers: tuple[
        int, ...
    ] = ()  # the ranks the decision is about (dead, missing, absent, the one that passed)
    cause: tuple[int, ...] = ()  # ranks the headline blames (a dead rank): their places come first
    advice: str | None = None  # where the verdict knows more than its class: a key of its `[guard.advice]`

    @property
    def class_(self) -> str:
        return self.decision.class_

    def facts(self) -> dict[str, Any]:
        facts: dict[str, Any] = {"kind": self.decision.value}
        if self.mismatch:
            facts["mismatch"] = list(self.mismatch)
        key = _PEERS_KEY.get(self.decision)
        if key:
            facts[key] = self.peers[0] if key == "peer" else list(self.peers)
        facts.update({"group": self.group, "seq": self.seq,
                      "ranks": {str(r): row.facts() for r, row in self.rows.items()}})
        return facts

    def finding(self) -> Finding:
        locations = []
        evidence = []
        for rank in sorted(self.rows):
            row = self.rows[rank]
            if row.location:
                locations.append(Location(row.location[0], row.location[1], rank=rank))
            evidence.append(Evidence(f"rank {rank}: {row.state}", rank=rank))
        # a renderer names the first location as the finding's place (`path:line: class`)
        locations.sort(key=lambda loc: loc.rank not in self.cause)
        return Finding(
            class_=self.class_,
            message=self.headline,
            severity=Severity.ERROR,
            locations=tuple(locations),
            fix=Fix(advice(self.class_, self.advice)),
            evidence=tuple(evidence),
            references=class_references(self.class_),
            facts=self.facts(),
        )


def rows_of(records: Mapping[int, RankRecord], world_size: int, dead: Collection[int]) -> dict[int, RankRow]:
    return {r: rank_row(records.get(r), r, dead) for r in range(world_size)}


# ---- what a peer did at a position ---------------------------------------------------------------------
def call_at(record: RankRecord, group: str, seq: int) -> CallRecord | None:
    """The call a rank made at (group, seq), if its record still shows it."""
    current = record.current
    if current is not None and current.group == group and current.seq == seq:
        return current
    for call in reversed(record.recent or ()):
        if call.group == group and call.seq == seq:
            return call
    return None


def made_from_python(record: RankRecord, group: str, seq: int) -> bool | None:
    """Whether a peer issued collective #seq of a group from Python (True), did not (False: it was a C++
    collective, or the peer never made it), or its history cannot tell (None: its ring no longer reaches
    back that far, say after many calls on other groups)."""
    if call_at(record, group, seq) is not None:
        return True
    if record.python_seqs is not None:
        seqs = record.python_seqs.get(group)
        if seqs and seq in seqs:
            return True
        if record.history_complete or (seqs and min(seqs) < seq):
            return False
        return None
    # a record without the per-group history: judge from its recent records alone
    recent = [c for c in record.recent or () if c.group == group]
    if recent and min(c.seq for c in recent) > seq:
        return None
    return False


# ---- the waiting rank and its rules --------------------------------------------------------------------
@dataclass(frozen=True)
class Waiter:
    """A rank waiting in (or failed in) a collective, with everything the rules judge it against."""

    rank: int
    record: RankRecord
    call: CallRecord
    records: Mapping[int, RankRecord]
    world_size: int
    dead: frozenset[int]
    hang_after: float

    @property
    def members(self) -> list[int]:
        """The other ranks of the call's group."""
        members = self.record.groups.get(self.call.group)
        return [r for r in range(self.world_size) if r != self.rank and (members is None or r in members)]

    @property
    def waited(self) -> float:
        return self.record.waited or 0.0

    @property
    def metric(self) -> MetricOrigin | None:
        return self.record.metric

    def rows(self) -> dict[int, RankRow]:
        return rows_of(self.records, self.world_size, self.dead)

    def verdict(self, decision: Decision, headline: str, **facts: Any) -> Verdict:
        return Verdict(decision, headline, self.rows(), self.call.group, self.call.seq, **facts)


def mismatch_headline(a: tuple[int, CallRecord], b: tuple[int, CallRecord], diff: Collection[str],
                      metrics: Mapping[int, MetricOrigin | None] | None = None, completed: bool = False,
                      completed_on: int | None = None) -> str:
    """`shape mismatch: rank 0 all_reduce(SUM) [3] float32 vs rank 1 ... at train.py:12 (collective #4 of
    group 0)`: two ranks' calls of one position, lower rank first. `completed`: both ranks returned
    from it; `completed_on`: that one rank did."""
    if b[0] < a[0]:
        a, b = b, a
    words = " and ".join(_FIELD_WORDS[d] for d in diff) or "sequence"
    site_a = where(a[1], (metrics or {}).get(a[0]))
    site_b = where(b[1], (metrics or {}).get(b[0]))
    at = f" at {site_a}" if site_a == site_b else f" at {site_a} vs {site_b}"
    tail = "; the backend completed it anyway, so results differ between ranks" if completed else ""
    if completed_on is not None and not completed:
        tail = f"; rank {completed_on} returned from it anyway, with wrong data"
    return (f"{words} mismatch: rank {a[0]} {describe(a[1])} vs rank {b[0]} {describe(b[1])}{at} "
            f"(collective #{a[1].seq} of group {a[1].group}{tail})")


def earlier_mismatch(waiter: Waiter) -> Verdict | None:
    """An earlier position the waiter and a peer both passed with different calls: gloo completes
    mismatched calls of equal shapes (two Lightning metrics synced against each other), and what hangs
    later follows from it. The first such position in the waiter's order."""
    ours = {c.position: c for c in waiter.record.recent or () if c.seq >= 0}
    found: tuple[int, int, CallRecord, CallRecord, list[str]] | None = None
    for peer in waiter.members:
        for theirs in (waiter.records[peer].recent or ()) if peer in waiter.records else ():
            own = ours.get(theirs.position)
            if own is None or own.failed or theirs.failed:
                continue
            diff = differences(own, theirs)
            if diff and (found is None or own.index < found[0]):
                found = (own.index, peer, own, theirs, diff)
    if found is None:
        return None
    _, peer, own, theirs, diff = found
    headline = mismatch_headline((waiter.rank, own), (peer, theirs), diff, completed=True)
    return Verdict(
        Decision.COMPLETED_MISMATCH, headline, waiter.rows(), own.group, own.seq, mismatch=tuple(diff)
    )


def same_position_mismatch(waiter: Waiter) -> Verdict | None:
    """A peer at the same position with another call: decidable at once."""
    call = waiter.call
    if call.seq < 0:
        return None
    for peer in waiter.members:
        record = waiter.records.get(peer)
        theirs = call_at(record, call.group, call.seq) if record is not None else None
        if record is None or theirs is None:
            continue
        diff = differences(call, theirs)
        if not diff:
            continue
        metrics = {waiter.rank: waiter.metric, peer: record.metric}
        # gloo completes a call that receives less than it expected (same op, other sizes): that rank went
        # on with wrong data
        completed_on = peer if theirs.state.value == "done" and "op" not in diff else None
        headline = mismatch_headline(
            (waiter.rank, call), (peer, theirs), diff, metrics, completed_on=completed_on
        )
        advice = None
        if "op" in diff:
            # Two different collectives at one position: the usual cause is a call only some ranks make.
            branched = _branch_on_path(waiter, (waiter.rank, call), (peer, theirs))
            if branched is not None:
                headline += f"; rank {branched[0]} got to its call through {branched[1].describe()}"
                advice = "rank-conditional-mismatch"
        return waiter.verdict(Decision.MISMATCH, headline, mismatch=tuple(diff), advice=advice)
    return None


def _branch_on_path(waiter: Waiter, *calls: tuple[int, CallRecord]) -> tuple[int, RankBranch] | None:
    """The first of these ranks whose way to its call runs through a rank-conditional branch, and that
    branch: read from its published stack, else from the call's own user line."""
    for rank, call in calls:
        record = waiter.records.get(rank)
        stack = record.stack if record is not None and record.current == call else ()
        branch = rank_branch(stack or tuple(f for f in (call.site,) if f))
        if branch is not None:
            return rank, branch
    return None


def peer_passed_outside_python(waiter: Waiter) -> Verdict | None:
    """A peer already past this position with something Python never saw (C++-issued, e.g. DDP's
    buckets). Before the dead-rank rule: such a mismatch often kills both ranks (gloo aborts on the size
    mismatch), and the peer's death is then the consequence, not the cause."""
    call = waiter.call
    if call.seq < 0:
        return None
    for peer in waiter.members:
        record = waiter.records.get(peer)
        if record is None or record.recent is None:
            continue  # an ordinary heartbeat record: its history is published only once asked for
        their_seq = record.seqs.get(call.group)
        if (their_seq is None or their_seq <= call.seq) and _aborted_on_its_peers_data(waiter):
            # it sent this position's data, which gloo aborted on; stopped before it published that
            their_seq = call.seq + 1
        if their_seq is None or their_seq <= call.seq:
            continue
        if made_from_python(record, call.group, call.seq) is not False:
            continue  # it made this call (a gather's non-root finishes early), or its history cannot tell
        headline = _passed_headline(waiter, peer, record, their_seq)
        branch = rank_branch(waiter.record.stack or tuple(f for f in (waiter.call.site,) if f))
        advice: str | None
        if branch is not None:
            # it got here through a branch its peer did not take: that, not an extra batch, is the likely
            # cause
            headline += f"; rank {waiter.rank} got to its call through {branch.describe()}"
            advice = "rank-conditional"
        elif in_backward(record.stack) and not in_compiled_graph(record.stack):
            advice = "uneven-steps"  # the peer is in an extra step's backward, and no rank test led here
        else:
            advice = None  # evidence for neither: the class's default advice names every cause
        return waiter.verdict(Decision.PASSED_OUTSIDE_PYTHON, headline, peers=(peer,), advice=advice)
    return None


def _aborted_on_its_peers_data(waiter: Waiter) -> bool:
    """Whether the waiter died of gloo's abort in this call, with one peer: gloo aborts (an exception in its
    I/O thread, uncaught) when a message a peer sent for this position does not fit, so that peer reached
    this position, whatever its last published sequence number says (torchrun may stop it before it says
    more). Not on CUDA tensors: NCCL's watchdog aborts on a timeout too, whoever was late."""
    record, call = waiter.record, waiter.call
    return (
        record.state is RankState.DEAD
        and record.signal == "SIGABRT"
        and record.current == call
        and bool(call.devices)
        and all(device == "cpu" for device in call.devices)
        and len(waiter.members) == 1
    )


def _passed_headline(waiter: Waiter, peer: int, record: RankRecord, their_seq: int) -> str:
    call, seq, stack = waiter.call, waiter.call.seq, record.stack
    user = user_line(stack)
    there = ""
    if user:
        now = "died" if record.state is RankState.DEAD else "now in backward" if in_backward(stack) else "now"
        there = f" ({now} at {user})"
    if in_compiled_graph(stack):
        # its stack now, not where it made the call: a hint, worded as one
        passed_with = ("a collective issued outside torch.distributed's Python functions (it runs a "
                       "torch.compile'd graph, whose collectives are such)")
    else:
        passed_with = "a collective issued outside Python (from C++, e.g. DDP's gradient all_reduce)"
    if their_seq == seq + 1:
        # #seq is the last it issued: it may well be waiting in it still, not past it
        peer_did = f"rank {peer}'s #{seq} is {passed_with}{there}"
    else:
        peer_did = f"rank {peer} already passed #{seq} with {passed_with} and got to #{their_seq}{there}"
    verb = "was in" if waiter.record.state is RankState.DEAD else "waits in"
    return (
        f"rank {waiter.rank} {verb} {describe(call)} at {where(call, waiter.metric)} (collective #{seq} of "
        f"group {call.group}), but {peer_did}"
    )


def peer_left(waiter: Waiter) -> Verdict | None:
    """A peer that left: died (dead-rank) or exited without making this call (divergence). Of the dead, one
    that died failing in a collective ("Connection reset by peer": torchrun then stopped it) is the
    consequence of another's death, and is named only when no other death explains it."""
    call = waiter.call
    for peer in sorted(waiter.members, key=lambda p: died_of_a_failed_collective(waiter.records.get(p))):
        record = waiter.records.get(peer)
        if peer in waiter.dead or (record is not None and record.state is RankState.DEAD):
            if record is not None and record.error and not died_of_a_failed_collective(record):
                # an uncaught exception: named at the user's line it was raised from
                record = _placed_at_its_error(record)
                waiter = replace(waiter, records={**waiter.records, peer: record})
            # its own Python error first (an uncaught exception), else how its process ended
            how = (record.error or how_it_ended(record)) if record is not None else None
            headline = (
                f"rank {peer} {how_it_left(record, how)}{died_at(record) if record else ''} while rank "
                f"{waiter.rank} waits in {describe(call)} at {where(call, waiter.metric)}"
            )
            return waiter.verdict(Decision.PEER_DEAD, headline, peers=tuple(sorted(waiter.dead | {peer})),
                                  cause=(peer,), advice=death_advice(record))
        if (record is not None and record.state is RankState.EXITED
                and made_from_python(record, call.group, call.seq) is False):
            # (a peer that made this call and then left is not blamed: a gather's non-root ranks finish
            # their part before the root has everyone's)
            headline = (
                f"rank {waiter.rank} waits in {describe(call)} at {where(call, waiter.metric)}, but rank "
                f"{peer} finished without calling it (collective #{call.seq} of group {call.group})"
            )
            return waiter.verdict(Decision.PEER_EXITED, headline, peers=(peer,))
    return None


def how_it_left(record: RankRecord | None, how: str | None) -> str:
    """`exited with sys.exit(3)` for a rank that gave up, `died (ValueError: boom)` for the others."""
    if record is not None and record.gave_up:
        return f"exited with {how}"
    return f"died ({how or 'no heartbeat / process gone'})"


def death_advice(record: RankRecord | None) -> str | None:
    """The advice for how a dead rank ended, where its signal says more than the class's fix; none for a
    Python error (its traceback says what to fix)."""
    if record is not None and record.gave_up:
        return "gave-up"
    if record is None or record.error:
        return None
    name = fatal_signal(record)
    if name == "SIGKILL":
        return "killed"
    if name == "SIGBUS":
        return "bus"
    if record.died_here:  # its fault log holds the line it crashed on
        return "crashed"
    return None


def peers_elsewhere(waiter: Waiter) -> Verdict | None:
    """Peers merely elsewhere: a verdict only after --hang-after (they may just be slow), or at once for a
    call that failed."""
    call, failed, waited = waiter.call, waiter.call.failed, waiter.waited
    if waited < waiter.hang_after and not failed:
        return None
    records = waiter.records
    absent = [p for p in waiter.members if p in records and call_at(records[p], call.group, call.seq) is None]
    missing = [p for p in waiter.members if p not in records]
    if not missing and alone_peers(records, call, absent, waiter.hang_after):
        # slow, not stuck: --hang-after is for stuck ranks (long_section.py notes it); a verdict only
        # once the backend gave up on the wait
        if not failed:
            return None
        headline = alone_headline(waiter.rank, call, waited, failed, records, absent)
        return waiter.verdict(Decision.PEER_ALONE, headline, peers=tuple(absent))
    if not failed and any(progress_unknown(records[p], waited, waiter.hang_after) for p in absent):
        return None  # a peer not yet seen twice may be slow: a hang only once its stillness is known
    if not absent and not missing:
        if failed:
            return None
        headline = (
            f"every rank is in {describe(call)} (collective #{call.seq} of group {call.group}) and none "
            f"has completed it for {waited:.0f} s"
        )
        return waiter.verdict(Decision.ALL_STUCK, headline)
    elsewhere = [f"rank {p} is {rank_row(records[p], p, waiter.dead).state}" for p in absent]
    elsewhere += [f"rank {p} never reported" for p in missing]
    in_other = any(records[p].current is not None for p in absent)
    headline = (
        f"rank {waiter.rank} {'failed' if failed else 'has waited ' + format(waited, '.0f') + ' s'} in "
        f"{describe(call)} at {where(call, waiter.metric)} (collective #{call.seq} of group {call.group}); "
        + "; ".join(elsewhere)
    )
    decision = Decision.PEER_IN_OTHER_COLLECTIVE if in_other else Decision.PEERS_ELSEWHERE
    return waiter.verdict(decision, headline, peers=tuple(absent + missing))


Rule = Callable[[Waiter], "Verdict | None"]
# In order: the first rule that decides wins.
RULES: tuple[Rule, ...] = (earlier_mismatch, same_position_mismatch, peer_passed_outside_python, peer_left,
                           peers_elsewhere)


def decide(
    records: Mapping[int, RankRecord],
    world_size: int,
    *,
    dead: Collection[int],
    grace: float,
    hang_after: float,
) -> Verdict | None:
    """A verdict for the job, or None while nothing is decidable yet. Waiting ranks are judged longest
    waiting first (records rebuilt from files come in any order)."""
    dead = frozenset(dead)
    waiting = sorted(
        (r for r, rec in records.items() if rec.current is not None and rec.current.op not in P2P_OPS
         and r not in dead and ((rec.waited or 0) >= grace or rec.current.failed)),
        key=lambda r: (-(records[r].waited or 0), r),
    )
    for rank in waiting:
        record = records[rank]
        assert record.current is not None
        waiter = Waiter(rank, record, record.current, records, world_size, dead, hang_after)
        for rule in RULES:
            verdict = rule(waiter)
            if verdict is not None:
                return with_pass_counts(verdict, records)
    return None


# what ranks that ran different numbers of passes of a sharded model look like to the rules
_SHARDED_CONSEQUENCES = frozenset({
    Decision.MISMATCH, Decision.COMPLETED_MISMATCH, Decision.PASSED_OUTSIDE_PYTHON, Decision.PEER_EXITED,
    Decision.PEERS_ELSEWHERE, Decision.PEER_IN_OTHER_COLLECTIVE, Decision.ALL_STUCK,
})


def with_pass_counts(verdict: Verdict, records: Mapping[int, RankRecord]) -> Verdict:
    """A verdict re-told as sharded-step-divergence when the ranks' forward counts of a sharded root differ
    (sharded_steps.py): the counts and each rank's `model(...)` line first, the collectives after."""
    if verdict.decision not in _SHARDED_CONSEQUENCES:
        return verdict
    found = pass_difference(records)
    if found is None:
        return verdict
    headline = found.headline
    if found.branched is not None and "got to its call through" not in verdict.headline:
        headline += f"; rank {found.branched[0]}'s last pass runs under {found.branched[1]}"
    return replace(verdict, decision=Decision.SHARDED_STEPS, headline=f"{headline}; {verdict.headline}",
                   advice="rank-conditional" if found.branched else found.kind.advice)


def chain_mismatch(rank: int, ours: Checkpoint, theirs: Checkpoint) -> Verdict | None:
    """Two ranks' chain checkpoints of one group that differ (consensus.py): the first pair of calls that
    differ, or the segments' last calls."""
    pair = first_difference(ours, theirs)
    if pair is None:
        if not ours.calls or not theirs.calls:
            return None
        pair = ours.calls[-1], theirs.calls[-1]
    mine: tuple[int, CallRecord] = (rank, pair[0])
    other: tuple[int, CallRecord] = (theirs.rank, pair[1])
    first, second = sorted([mine, other], key=lambda item: item[0])
    diff = differences(first[1], second[1])
    headline = mismatch_headline(first, second, diff, completed=True)
    rows = {r: RankRow(RankStatus.RUNNING, f"passed {describe(call)}", where(call), call=call,
                       location=location_of(call, None, ()))
            for r, call in (first, second)}
    return Verdict(
        Decision.COMPLETED_MISMATCH, headline, rows, first[1].group, first[1].seq, mismatch=tuple(diff)
    )


def died_first(records: Mapping[int, RankRecord], world_size: int, first: Collection[int]) -> Verdict:
    """The job ended with nobody waiting in a collective, but `first` died (an uncaught exception, a signal,
    a C++ abort, a non-zero exit) while the others still ran, and the launcher stopped them: the dead rank
    is the cause even though no peer was left waiting on it. A rank that raised is placed at the user's
    line the exception came from (its exit record's stack)."""
    records = {r: _placed_at_its_error(record) if r in first else record for r, record in records.items()}
    causes = []
    raised = False
    for rank in sorted(first):
        record = records.get(rank) or RankRecord(rank)
        last = record.last
        if record.error:
            raised = True
            cause = f"rank {rank} raised {record.error}{died_at(record)}"
        else:
            how = how_it_ended(record) or "process gone, no Python error: a signal such as SIGKILL"
            cause = f"rank {rank} died ({how}){died_at(record)}"
        if last:
            cause += f" {'in' if record.current else 'after'} {describe(last)} at {where(last, None)}"
        causes.append(cause)
    stopped = [r for r in range(world_size) if r in records and records[r].state is RankState.STOPPED]
    headline = "; ".join(causes)
    if stopped:
        signals = {fatal_signal(records[r]) for r in stopped}
        how = f" with {signals.pop()}" if len(signals) == 1 and None not in signals else ""
        headline += (f"; the launcher then stopped rank{'s' if len(stopped) > 1 else ''} "
                     + ", ".join(map(str, stopped)) + how)
    blamed = records.get(min(first)) or RankRecord(min(first))
    last = blamed.last
    decision = Decision.RAISED_FIRST if raised else Decision.DIED_FIRST
    return Verdict(decision, headline, rows_of(records, world_size, first), last.group if last else None,
                   last.seq if last else None, peers=tuple(sorted(first)), cause=tuple(sorted(first)),
                   advice="raised" if blamed.error else death_advice(blamed))


def _placed_at_its_error(record: RankRecord) -> RankRecord:
    """A rank that died of a Python error, with its stack (where the error was raised) as the place it
    died, as a crashed rank's fault log is."""
    if record.error and record.stack and record.current is None:
        return replace(record, died_here=True)
    return record
