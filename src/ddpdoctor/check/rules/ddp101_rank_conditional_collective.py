from __future__ import annotations

from collections.abc import Iterator

from ...findings import Applicability, Edit, Finding, Fix, Severity
from ..collective_functions import CollectiveFunctions
from ..collectives import TRIGGERS, CollectiveCalls
from ..guards import RANK_WORDS, GuardedCall, RankFlow
from ..project import Step, show_chain
from ..registry import Rule, register
from ..source import SourceFile, keyword


@register
class RankConditionalCollective(Rule):
    """
    ## What it does
    Finds collectives that only some ranks reach: a `torch.distributed` collective (`all_reduce`,
    `barrier`, `broadcast`, `new_group`, `init_process_group`, ...), Lightning's
    `self.log(..., sync_dist=True)`, `self.all_gather`, `trainer.strategy.barrier/broadcast/reduce`,
    `trainer.save_checkpoint` (it ends in a barrier), Fabric's and accelerate's collectives
    (`fabric.barrier`, `fabric.save`, `accelerator.gather`, `wait_for_everyone`, ...) and `compute()` /
    `sync()` of a torchmetrics metric created in the same file, called under a rank condition.

    A rank condition is a test of `rank`, `global_rank`, `local_rank`, `dist.get_rank()`,
    `int(os.environ["RANK"])`, `trainer.is_global_zero`, `self.global_rank`,
    `accelerator.is_main_process`, `fabric.is_global_zero`, ... — also through local variables
    (`main = rank == 0`), `and`/`or`/`not`, an early `return`/`continue` under such a test, and in functions
    decorated with `@rank_zero_only`.

    A guarded call to a function that issues a collective counts too, at any depth and across the
    project's files: a function of the same file, a function of another module (`import store`,
    `from .sync import wait_all as everyone`, re-exports through a package's `__init__`), a method of the
    same class or inherited from a project base class (`self._log_metrics()` whose `self.log(...,
    sync_dist=True)` is in the parent class's module). The finding is at the guarded call and shows the
    chain: `` `write_index()` (store.py:15) → `list_files()` (store.py:11) → `torch.distributed.barrier`
    (store.py:7) ``. When `ddpdoctor check` is given a directory or several files, they are read as one
    project; a single file is checked alone.

    Limits: calls the checker cannot resolve (through `getattr`, a callable passed as an argument, a method
    of an object whose class is not constructed in the same function, a library) are unknown and never
    evidence. A function counts as issuing a collective if any path through it may (a helper that only
    syncs under its own test is still followed).

    Not findings: an `if` whose two branches make the same collectives in the same order (every path
    through each branch is compared, so nested per-rank protocols such as "receive unless I am the source"
    count as balanced), a rank test that only chooses a value (`src = 0 if rank == 0 else None`),
    `self.log(..., rank_zero_only=True)`, the "main process first" idiom (`if local_rank not in (-1, 0):
    barrier()` ... `if local_rank == 0: barrier()`: two different rank tests in one block with the same
    collectives), tests of group membership (`if rank not in ranks: return`) or of configuration
    (`rank is None`, `rank != -1`), and point-to-point calls (`send`/`recv`), where a rank test is how the
    code says who sends.

    ## Why is this bad?
    Every rank of a process group must make the same collectives in the same order. A collective that only
    rank 0 reaches waits for peers that never come: the job hangs without a message until the backend's
    timeout (30 minutes for gloo, 10 for NCCL), then dies with a watchdog or `Connection reset by peer`
    error that points nowhere near this line. Lightning's `self.log(..., sync_dist=True)` is such a
    collective: logging under `if self.trainer.is_global_zero:` hangs the job.

    ## Example
    ```python
    def on_validation_epoch_end(self):
        if self.trainer.is_global_zero:
            score = expensive_metric(self.outputs)
            self.log("val_score", score, sync_dist=True)  # rank 0 waits for the others forever
    ```

    ## Use instead
    ```python
    def on_validation_epoch_end(self):
        if self.trainer.is_global_zero:
            score = expensive_metric(self.outputs)
            self.log("val_score", score, rank_zero_only=True)  # no sync: only rank 0 logs
    ```
    or compute the value on every rank and log it with `sync_dist=True` outside the rank test. For
    `torch.distributed` calls, call the collective on every rank and guard only the side effect (printing,
    saving).

    ## Fix safety
    `self.log(..., sync_dist=True)` under a rank guard becomes `self.log(..., rank_zero_only=True)`. The fix
    is safe: in that branch a sync can only hang, and `rank_zero_only=True` is Lightning's documented way to
    log from one rank. A metric logged that way cannot be monitored by callbacks on the other ranks (early
    stopping, checkpointing), which is already the case for a value only rank 0 computes. Other
    collectives have no automatic fix: where the call belongs depends on the program.

    ## References
    - <https://lightning.ai/docs/pytorch/stable/visualize/logging_advanced.html#rank-zero-only>
    - <https://pytorch.org/docs/stable/distributed.html#collective-functions>
    - <https://github.com/Lightning-AI/pytorch-lightning/issues/19783>
    """

    code = "DDP101"
    name = "rank-conditional-collective"
    class_slug = "collective-divergence"
    severity = Severity.ERROR
    summary = "a collective reachable only under a rank condition"
    triggers = TRIGGERS
    project_wide = True

    @classmethod
    def wanted_in_project(cls, text: str) -> bool:
        """With other files known, a call under a rank test may reach a collective in any of them."""
        return cls.wanted(text) or any(word in text for word in RANK_WORDS)

    def check(self, source: SourceFile) -> Iterator[Finding]:
        labels = CollectiveCalls(source)
        helpers = CollectiveFunctions(source, labels)
        flow = RankFlow(source, helpers.balanced, collectives=helpers.paths)
        for guarded in flow.calls:
            guard = guarded.guard
            if guard is None:
                continue
            label = labels.label(guarded.call)
            if guard.trusted:
                continue
            if label is not None:
                yield self._direct(source, guarded, label)
                continue
            target = helpers.resolve(guarded.call, guarded.cls)
            if target is None or helpers.issues(target) is None:
                far = helpers.elsewhere(guarded.call, guarded.cls)
                if far is None or source.project is None:
                    continue
                steps = (source.project.where(far[0]), *far[1])
                yield self._through(source, guarded, steps)
                continue
            inner_label, inner_call = helpers.issues(target)  # type: ignore[misc]
            steps = helpers.chain(guarded.call, guarded.cls) or (
                Step(f"`{target.name}()`", source.path, target.lineno),
                Step(f"`{inner_label}`", source.path, inner_call.lineno))
            yield self._through(source, guarded, steps)

    def _through(self, source: SourceFile, guarded: GuardedCall, steps: tuple[Step, ...]) -> Finding:
        assert guarded.guard is not None
        return self.finding(
            source, guarded.call,
            f"`{source.segment(guarded.call.func)}()` issues a collective, but only some ranks call it "
            f"({guarded.guard.where()}); the other ranks never join it, so the job hangs: {show_chain(steps)}",
            fix=Fix(message="call it on every rank, or move the collective out of it"),
            facts={"collective": steps[-1].what.strip("`"), "guard_line": guarded.guard.line,
                   "via": " → ".join(step.show() for step in steps)},
        )

    def _direct(self, source: SourceFile, guarded: GuardedCall, label: str) -> Finding:
        assert guarded.guard is not None
        fix = None
        if label.endswith("(sync_dist=True)"):
            sync = keyword(guarded.call, "sync_dist")
            assert sync is not None
            message = "log with `rank_zero_only=True` instead of `sync_dist=True` (no sync in a one-rank branch)"
            # With `rank_zero_only=` already there, or `**kwargs` that may hold it, a second one would not
            # compile or would fail at run time: describe the fix, do not apply it.
            if keyword(guarded.call, "rank_zero_only") or any(kw.arg is None for kw in guarded.call.keywords):
                fix = Fix(message=message)
            else:
                line, column, end_line, end_column = source.span(sync)
                fix = Fix(
                    message=message,
                    edits=(Edit(source.path, line, column, end_line, end_column, "rank_zero_only=True"),),
                    applicability=Applicability.SAFE,
                )
            shown = label.replace("(sync_dist=True)", "(..., sync_dist=True)")
            what = f"`{shown}` syncs the value across ranks"
        else:
            fix = Fix(message="call the collective on every rank and guard only the side effect")
            what = f"`{label}` is a collective"
        return self.finding(
            source, guarded.call,
            f"{what}, but only some ranks reach it ({guarded.guard.where()}); "
            "the other ranks never call it, so the job hangs",
            fix=fix, facts={"collective": label, "guard_line": guarded.guard.line},
        )
