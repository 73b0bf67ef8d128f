"""sharded-step-divergence (F11) in the judge: a verdict about ranks whose forward counts of a sharded root
differ is re-told with the counts and each rank's last `model(...)` line. The real 2-rank FSDP2 job is in
test_run_jobs.py (test_an_fsdp2_extra_forward_on_one_rank_is_counted)."""

from __future__ import annotations

from dataclasses import replace

from record_builders import fp, rec

from ddpdoctor.guard.judge.verdict import Decision, decide
from ddpdoctor.records import ModelPasses, RankRecord


def _passes(forwards: int, line: int, wrapper: str = "fully_shard") -> tuple[ModelPasses, ...]:
    return (ModelPasses("Transformer", wrapper, forwards, "/job/eval.py", line),)


def _stuck(passes0: tuple[ModelPasses, ...], passes1: tuple[ModelPasses, ...]) -> dict[int, RankRecord]:
    gather = fp(op="all_gather_single", seq=6, shapes=((4,), (8,)))
    reduce = fp(op="all_reduce", seq=6, shapes=((1,),))
    return {0: replace(rec(0, gather, 2.0), passes=passes0), 1: replace(rec(1, reduce, 1.5), passes=passes1)}


def test_differing_counts_of_a_sharded_root_name_each_rank_and_its_line() -> None:
    verdict = decide(_stuck(_passes(4, 35), _passes(3, 35)), 2, dead=(), grace=0.0, hang_after=300.0)
    assert verdict is not None and verdict.decision is Decision.SHARDED_STEPS
    assert verdict.class_ == "sharded-step-divergence"
    assert verdict.headline.startswith(
        "rank 0 ran 4 forward passes of the sharded `Transformer` (the last at /job/eval.py:35), "
        "rank 1 ran 3 (the last at /job/eval.py:35)"
    )
    assert "; op mismatch: rank 0 all_gather_single" in verdict.headline  # what the collectives show, after
    assert verdict.finding().facts["kind"] == "sharded-steps"


def test_equal_counts_or_a_ddp_model_keep_the_verdict_they_had() -> None:
    equal = decide(_stuck(_passes(4, 35), _passes(4, 35)), 2, dead=(), grace=0.0, hang_after=300.0)
    ddp = decide(_stuck(_passes(4, 35, "DistributedDataParallel"), _passes(3, 35, "DistributedDataParallel")),
                 2, dead=(), grace=0.0, hang_after=300.0)
    unknown = decide(_stuck((), ()), 2, dead=(), grace=0.0, hang_after=300.0)
    assert {v.decision for v in (equal, ddp, unknown) if v is not None} == {Decision.MISMATCH}


def _with_backwards(forwards: int, backwards: int) -> tuple[ModelPasses, ...]:
    return (ModelPasses("Transformer", "fully_shard", forwards, "/job/train.py", 20, backwards,
                        "/job/train.py", 22),)


def test_a_skipped_backward_is_told_by_the_backward_counts() -> None:
    # rank 1 skipped a backward and went on to the next forward: one forward more, one backward less
    skipped = decide(_stuck(_with_backwards(4, 4), _with_backwards(5, 3)), 2, dead=(), grace=0.0,
                     hang_after=300.0)
    assert skipped is not None and skipped.decision is Decision.SHARDED_STEPS
    assert skipped.headline.startswith(
        "rank 0 ran 4 backward passes of the sharded `Transformer` (the last at /job/train.py:22), "
        "rank 1 ran 3 (the last at /job/train.py:22) (forward passes: rank 0 4, rank 1 5): every backward"
    ), skipped.headline
    assert "must still run the backward" in skipped.finding().fix.message  # type: ignore[union-attr]
    # an extra training step on one rank (one forward and one backward more) is told by the forwards
    extra = decide(_stuck(_with_backwards(5, 5), _with_backwards(4, 4)), 2, dead=(), grace=0.0,
                   hang_after=300.0)
    assert extra is not None and extra.headline.startswith("rank 0 ran 5 forward passes"), extra.headline


def test_the_passes_keep_their_json_form() -> None:
    old = ["Transformer", "fully_shard", 4, "/job/eval.py", 35]
    assert ModelPasses.from_json(old) == ModelPasses("Transformer", "fully_shard", 4, "/job/eval.py", 35)
    both = _with_backwards(4, 3)[0]
    assert ModelPasses.from_json(both.to_list()) == both
