"""A timeout in a sharded model's hidden collectives, read as sharded-step-divergence (F11).

FSDP, FSDP2 (`fully_shard`) and DeepSpeed ZeRO-3 all-gather parameters before each forward (and again in
the backward, where the forward resharded) and reduce-scatter gradients in the backward, with
`all_gather_into_tensor` / `reduce_scatter_tensor`: NCCL's watchdog and the Flight Recorder name them
`_ALLGATHER_BASE` / `_REDUCE_SCATTER_BASE` (`nccl:_all_gather_base`, `nccl:_reduce_scatter_base`), and no
user frame stands above them. When the ranks that time out wait at different positions (different
sequence numbers, or another op on some ranks) and one of them is such a collective, the ranks ran a
different number of forward or backward passes of the sharded model: that is the diagnosis, ahead of the
timeout it causes. Alone (every rank at the same position, or one report), a timeout in such a collective
is only a timeout; the class's data (`[[signatures]]` of F11) then names the possibility, below it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..findings import Evidence, Finding, Fix, Severity
from .analysis import MAX_EVIDENCE, Analysis
from .outcome import Diagnosis, first_evidence_line, log_location

SLUG = "sharded-step-divergence"
TIMEOUT_SLUG = "collective-timeout"
# the c10d OpType names of the collectives FSDP / ZeRO-3 issue inside forward and backward
SHARDED_OPS = frozenset({
    "_ALLGATHER_BASE", "_REDUCE_SCATTER_BASE", "ALLGATHER_COALESCED", "REDUCE_SCATTER_COALESCED",
    "_ALLGATHER_BASE_COALESCED", "_REDUCE_SCATTER_BASE_COALESCED", "COALESCED",
})
CONFIDENCE = 0.9  # above the timeout's 0.85: the positions say why the timeout came
SIGNATURE = "sharded-collective-positions"


def with_sharded_steps(analysis: Analysis, diagnoses: list[Diagnosis]) -> list[Diagnosis]:
    """`diagnoses` with sharded-step-divergence first where the timed-out ranks' positions say so."""
    positions: dict[int, tuple[int, str, Any]] = {}
    for hit in analysis.hits:
        if hit.signature.slug != TIMEOUT_SLUG or hit.rank is None:
            continue
        seq, op = hit.facts.get("seq_num"), hit.facts.get("op_type")
        if isinstance(seq, int) and isinstance(op, str) and hit.rank not in positions:
            positions[hit.rank] = (seq, op, hit)
    sharded = sorted(r for r, (_, op, _) in positions.items() if op in SHARDED_OPS)
    if not sharded or len({(seq, op) for seq, op, _ in positions.values()}) < 2:
        return diagnoses
    try:
        knowledge = analysis.kb.for_slug(SLUG)
    except (KeyError, LookupError):
        return diagnoses
    where = ", ".join(f"rank {r} in {op} #{seq}" for r, (seq, op, _) in sorted(positions.items()))
    explanation = [
        f"The ranks that timed out wait at different collectives ({where}), and "
        f"{'rank ' if len(sharded) == 1 else 'ranks '}{', '.join(map(str, sharded))} "
        f"{'waits' if len(sharded) == 1 else 'wait'} in a sharded model's own collective (`_ALLGATHER_BASE`: "
        "FSDP / ZeRO-3 gathering parameters for a forward or a backward; `_REDUCE_SCATTER_BASE`: reducing "
        "gradients in a backward), which no line of the program calls by name.",
        "The ranks ran a different number of forward or backward passes of the sharded model: one more "
        "`model(...)` on some ranks (an evaluation loop over per-rank data of unequal length, `generate()` "
        "stopping early, a forward under a rank test), or a `loss.backward()` skipped on some.",
    ]
    advice = knowledge.failure.fixes[:2]
    evidence: list[Evidence] = []
    for rank, (_, _, hit) in sorted(positions.items()):
        evidence.append(Evidence(text=hit.hit.raw.strip(), line=hit.hit.line, rank=rank))
    first_hit = positions[sharded[0]][2]
    finding = Finding(
        class_=SLUG,
        message=knowledge.failure.title,
        severity=Severity.ERROR,
        fix=Fix(message="; ".join(advice)) if advice else None,
        evidence=tuple(evidence[:MAX_EVIDENCE]),
        facts={
            "positions": {str(r): {"seq_num": seq, "op_type": op} for r, (seq, op, _) in positions.items()},
            "sharded_ranks": sharded,
            "signature": SIGNATURE,
        },
        confidence=CONFIDENCE,
        references=knowledge.failure.references,
    )
    read = Diagnosis(finding=finding, explanation=explanation, knowledge=knowledge, signature=SIGNATURE,
                     log_line=log_location(first_hit.hit.source, first_hit.hit.line, sharded[0]))
    out = [d for d in diagnoses if d.slug != SLUG or _from_the_guard(d)]
    if len(out) < len(diagnoses) or not any(d.slug == SLUG for d in out):
        out.append(read)
    return _sorted(out)


def _from_the_guard(diagnosis: Diagnosis) -> bool:
    """The guard's own report (`ddpdoctor run` counted the passes) says more than a reading of positions."""
    return diagnosis.signature == "guard-report"


def _sorted(diagnoses: Sequence[Diagnosis]) -> list[Diagnosis]:
    return sorted(diagnoses, key=lambda d: (-(d.finding.confidence or 0.0), first_evidence_line(d)))

