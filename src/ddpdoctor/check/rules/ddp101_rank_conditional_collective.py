from __future__ import annotations

import ast
from collections.abc import Iterator

from ...findings import Finding, Fix, Severity
from ..branch_moves import log_fix
from ..collective_functions import CollectiveFunctions
from ..collectives import LAUNCH_DEPENDENT, TRIGGERS, CollectiveCalls, launch_dependent
from ..constant_groups import ConstantGroups
from ..data_exits import DataTests, agreeing
from ..guards import RANK_WORDS, Guard, GuardedCall, RankFlow
from ..lightning_steps import SKIP_FIX, STEP, skipped_steps
from ..project import Step, show_chain
from ..reached_collectives import RankOnlyCaller, rank_only_callers
from ..registry import Rule, register
from ..source import SourceFile
from ..subgroups import chain_group, collective_group, made_only_under, mesh_layout_hedge, whole_groups


@register
class RankConditionalCollective(Rule):
    """
    ## What it does
    Finds collectives that only some ranks reach: a `torch.distributed` collective (`all_reduce`, `barrier`,
    `broadcast`, `new_group`, `init_process_group`, ...), Lightning's `self.log(..., sync_dist=True)`,
    `self.all_gather`, `trainer.strategy.barrier/broadcast/reduce`, `trainer.save_checkpoint` (ends in a
    barrier; in a file importing Lightning), Fabric's and accelerate's collectives (`fabric.barrier`, `save`,
    `load`, `accelerator.gather`, `gather_for_metrics`, `reduce`, `pad_across_processes`, `wait_for_everyone`,
    ...; also on the `self.accelerator` a trl or transformers trainer subclass inherits), DeepSpeed's
    `engine.save_checkpoint` (on an engine from `deepspeed.initialize`), `deepspeed.zero.GatheredParameters`,
    Hugging Face `trainer.train()`, `evaluate()` / `predict()` and `push_to_hub()` (it calls `save_model`
    first: "needs to be executed on all processes"; hedged where the file does not show DeepSpeed or FSDP),
    torch calls that are collectives under other names (torch 2.13: `torch.distributed.checkpoint.save`/`load`
    unless `use_collectives=False`, `init_device_mesh`, the `DistributedDataParallel(...)` constructor,
    FSDP's `summon_full_params` and `*optim_state_dict`), `deepspeed.comm`'s and `ignite.distributed`'s
    mirrors of torch.distributed's collectives, and
    `sync_on_compute=False`): an object of a torchmetrics class or of a project class deriving from one (in
    any file), made in this file, kept on a name or attribute, moved with `.to()`/`.cuda()`, or put in a dict
    or list and read back by key or by a loop over it. accelerate's `save_model` / `get_state_dict` and the HF
    Trainer's `save_model` count only where the file shows DeepSpeed or FSDP (a name ruled out by `!=`, `is
    not` or `not in` does not count): there they consolidate sharded weights with every rank; under plain DDP
    they write from the main process themselves and never wait. accelerate's `save_state` counts everywhere:
    under DeepSpeed or FSDP, which `accelerate config` picks at launch without a word in the code, it is a
    collective (accelerate#1171, diffusers#2606), and under DDP every process writes its own random states
    (`random_states_<process_index>.pkl`); where the file does not show the setup, the finding says both.
    Sources read: Lightning 2.6.6 `Trainer.save_checkpoint`, `Fabric.save` / `Fabric.load` ("must be called on
    all processes!", each ends in a barrier); accelerate 1.15.0 `Accelerator.save_model`, `get_state_dict`,
    `save_state`; DeepSpeed 0.16.5 `DeepSpeedEngine.save_checkpoint` ("all processes must call this method")
    and `GatheredParameters.__enter__/__exit__` (all-gather, then broadcast); transformers `Trainer.evaluate`
    (`evaluation_loop` gathers with `accelerator.gather_for_metrics`); torchmetrics 1.9.0
    `Metric._wrap_compute` (`sync_context`, `gather_all_tensors`).

    A rank condition is a test that some ranks pass and others do not: `rank == 0`, `local_rank == 0`,
    `dist.get_rank() != 0`, `int(os.environ["RANK"])`, `args.rank % ngpus_per_node == 0`, a node rank
    (`node_rank == 0`, `args.nr == 0`), `trainer.is_global_zero`, `accelerator.is_main_process` /
    `is_local_main_process`, `trainer.is_world_process_zero()`, ... — also through local variables
    (`main = rank == 0`) and `and`/`or`/`not` (`not distributed or rank == 0` is rank 0 in a distributed
    run), in functions decorated with `@rank_zero_only` (or with a project decorator, of any name and
    file, whose wrapper calls the function only under a rank test: its body is read, not its name), and
    after a rank branch that lets its ranks leave: a `continue`, `break`, `return` or `sys.exit()` (a clean
    exit: no status, or 0; `sys.exit(1)` and `exit("message")` end the job like a `raise`) anywhere inside
    `if rank == 0:` makes rank 0 skip the collectives after it in the same loop body or function (after a
    `break` or `return`, those earlier in the loop body too, which rank 0 misses in every later iteration).
    Such an exit is reported at each collective the remaining ranks wait in (where the hang shows) and once
    at the exit itself, the line the fix changes.

    A guarded call to a function that issues a collective counts too, at any depth and across the project's
    files: a function of the same file, a function of another module (`import store`, `from .sync import
    wait_all as everyone`, re-exports through a package's `__init__`), a method of the same class or inherited
    from a project base class (`self._log_metrics()` whose `self.log(..., sync_dist=True)` is in the parent
    class's module). The finding is at the guarded call and shows the chain: `` `write_index()` (store.py:15)
    → `list_files()` (store.py:11) → `torch.distributed.barrier` (store.py:7) ``; crossing into another file,
    it is also reported at the collective. Entering a `with` over a project context manager is a call of its
    whole body, before and after the `yield`: `with local_main_first(local_rank):` (a `@contextmanager` whose
    barriers sit under complementary local-rank tests) reached by only some ranks is reported at the `with`.
    Making an object of a project class is a call of its `__init__` (and what that calls): `ScoreFile(path,
    n)` under `if rank == 0:`, whose constructor ends in `dist.barrier()`, is reported, unless the call passes
    a flag that turns the barrier off (`ScoreFile(path, n, distributed=False)` with `if distributed and
    dist.is_initialized(): barrier()`: a bare flag parameter is read like a compared one). A function or
    method whose value is a rank test is one where it is called: `if self.checkpoint_due():` where
    `checkpoint_due` returns `if_main_process()` (or `dist.get_rank() == 0`) once an interval has passed and
    `False` otherwise, here or in a base class, through helpers of other files; not when what it returns was
    first broadcast (`broadcast_object_list(decision, src=0)`: rank 0's decision on every rank). A DTensor's
    `full_tensor()` is an all-gather and `redistribute(mesh, [Replicate()])` an all-gather or all-reduce
    (torch/distributed/tensor/_api.py: `full_tensor` is `redistribute(placements=[Replicate()] *
    mesh.ndim).to_local()`, "will perform necessary collectives"; `_redistribute.py`): a helper that gathers
    FSDP2's sharded parameters with `p.full_tensor()`, called under `if rank == 0:`, is reported. The
    receiver's type is not followed: `full_tensor` is read by its name in a file that imports torch (DTensor
    is torch's one class with that method), so a project method of that name would be misread. Packages kept
    in a `src/` folder resolve from scripts beside it (`scripts/train.py` importing `src/pkg/`). When
    `ddpdoctor check` is given a directory or several files, they are read as one project; a single file is
    checked with the local modules it imports.

    Limits: calls the checker cannot resolve (through `getattr`, a callable passed as an argument, a method of
    an object whose class is not constructed in the same function, a library) are unknown and never evidence.
    A function counts as issuing a collective if any path through it may (one that syncs under a test too).

    Not findings: an `if` whose two branches make the same collectives in the same order (every path through
    each branch is compared, so nested per-rank protocols such as "receive unless I am the source" count as
    balanced), a rank test that only chooses a value (`src = 0 if rank == 0 else None`), `self.log(...,
    rank_zero_only=True)`, the "main process first" idiom (`if local_rank not in (-1, 0): barrier()` ... `if
    local_rank == 0: barrier()`: two complementary rank tests in one block, what one lets through the other
    holds back, with the same collectives; `local_rank > 0` is `local_rank != 0` there, and a `return` under
    `not dist.is_initialized()` is a path of no distributed run; also with its second half nested in later
    branches: `if dist.get_rank() != 0: barrier()`, then `if cached: ...; if dist.get_rank() == 0: barrier()`
    / `else: assert dist.get_rank() == 0; ...; barrier()`, where the rest of the block, walked for each side
    of the first test with the later tests of the same value decided and an `assert` that side fails ending
    the path, makes the same one sequence of collectives), a rank branch that sends its ranks away after the
    same collectives the others make in the rest of the block (`if rank != 0: barrier(); return` then `try:
    ... finally: barrier()`; a `finally:` runs after a `return` in its `try:`), rank tests that balance across
    a function (`if not leader(): barrier()` and `if not node_leader(): barrier()` before a `yield`, `if
    leader(): barrier()` and `if node_leader(): barrier()` after it: the function walked once for each way to
    decide its distinct rank tests, at most four, and every way makes the same sequences of collectives, so
    each rank makes two barriers), tests of group membership (`if rank not in ranks: return`,
    `dist.get_rank(group=g) >= 0`: -1 outside `g`) or of configuration (`rank is None`, `rank != -1`, `not
    dist.is_initialized()`), a `raise` under a rank test (the process dies and the launcher stops the job with
    its error: a crash, not a hang), a collective on a group all of whose members pass the test (`g =
    new_group([0, 1])` ... `if rank in (0, 1): all_reduce(t, group=g)`; torch skips it on non-members), a
    collective on a named group under a test that reads only the rank in other named groups (`if
    tp_group.rank() == 0: dist.broadcast(t, 0, group=pp_group)`, here or at the end of a chain of project
    calls that passes none of the tested groups on: in a grid of tensor-, pipeline- and data-parallel groups
    the members of one share their rank in the others), and point-to-point calls (`send`/`recv`), where a rank
    test is how the code says who sends.

    Limits: the nested "main process first" pairing decides only later tests that read the same names as the
    first (`rank == 0` after `dist.get_rank() != 0` is not decided), and needs one sequence of collectives on
    every path. A rank test is recognised by its spelling (the names above, their local copies), not by
    following values across functions; framework objects are recognised by how the file makes or names them.

    Early exits on per-rank data (hedged: no rank is named, the value only may differ): a `continue`, `break`
    or `return` under a test of a value each rank computes from its own data, with collectives after it: the
    finiteness of this rank's loss (`torch.isfinite(loss)`, `loss.isnan()`; not a gradient or its norm,
    reduced before anyone reads it), its own clock (`time.time() - start > budget`), the fill level of a
    buffer it fills (`buffer.full()`, `len(buf) < n` after `buf.append` in a loop), an empty batch of a loader
    (`if batch is None: continue` in `for batch in train_loader`), `p.exists()` of a file written under a rank
    test (a name or constant shared with the write; a collective in its branch too, unless a branch tests the
    rank; a path handed in looks the same everywhere). Not when a collective above the test agreed on the
    value (`dist.all_reduce(flag)`, then `if flag.item(): break`). A re-raise of any or an OS error under a
    rank test (`if first_replica: try: download() except OSError: raise`) is such an exit too: a caller that
    catches it (a checkpoint reader gathers it first) leaves the others waiting. A LightningModule's
    `training_step` ends in a collective it does not call: with automatic optimisation Lightning runs the
    backward of the returned loss, DDP's gradient all-reduce; `return None` under a rank test or such a test
    skips it on those ranks (Lightning 2.6.6: None "is not supported for multi-GPU"). Other per-rank data (a
    spike against a per-rank average, a loop whose length differs per rank) is not read.

    ## Why is this bad?
    Every rank of a process group must make the same collectives in the same order. A collective that only
    rank 0 reaches waits for peers that never come: the job hangs without a message until the backend's
    timeout (30 minutes for gloo, 10 for NCCL), then dies with a watchdog or `Connection reset by peer`
    error that points nowhere near this line. Lightning's `self.log(..., sync_dist=True)` is such a
    collective: logging under `if self.trainer.is_global_zero:` hangs the job.

    ## Known problems
    A test of the rank in one named group around a collective on another is taken to pass
    all or none of the collective's group, the grid layout's rule; groups that nest (a model-parallel rank
    around a tensor-parallel collective) break it, and such a hang is missed. Only the group of the first
    collective a guarded project function reaches is read. A rank in a group kept on an attribute or returned
    by a helper (`self.instance_id = get_pg_rank(inter_group)`) counts as a rank in another group unless the
    test names the collective's group (`is_first(dp_group)`): one that holds the rank in the collective's own
    group is missed. A collective on a group that the file makes (`self.g = join_group(...)`) only under a
    rank test letting the same ranks through as the collective's is not reported: only they hold it (the other
    members, if any, run elsewhere); a group made so that another rank of the job should join is missed. A
    local-rank test around a collective on a device mesh's group (`g = mesh.get_group(0)`; or a call handing
    it on, `group=g`) is reported hedged: the members agree on the local rank only where the mesh's inner
    dimensions span whole nodes, which the source does not show. A rank test is recognised from what it reads
    (rank names and properties, `RANK`/`LOCAL_RANK`, the frameworks' rank flags, local copies, tuple
    unpacking, and the project's own helpers that return a rank, a tuple holding one or a rank test, across
    files and star imports; through `a if flag else b` on a parameter with a constant default, the default's
    branch for calls that leave the flag out). An attribute is a rank when every binding of it in its class
    and bases (any file) is one, or a constructor or method parameter that a caller passes a rank to
    (`self.device_id = device_id`, `Trainer(..., local_rank)`) or the result of a project function that
    returns one (`Trainer(is_vis=dist.is_visualizer())`, whose `return __rank == 0` reads a module global: a
    leading underscore does not hide a rank name); a file whose `if` reads such an attribute is checked
    whatever its own text names; `args.x` set to a rank test anywhere in the project is one, and so is one set
    to a conjunction that calls such a helper (`args.save_logs = args.logs and is_master(args)`). A parameter
    holds what the project's calls pass (`f(t, get_rank())`: `if who == 0:` tests the rank). An object a
    function makes once by a project constructor or classmethod factory (a singleton's `cls._instance = cls()`
    included) has its methods followed and its properties read as rank tests (`distr = Distrib.instance()`,
    `if distr.is_global_main:`, `distr.barrier()`). A function nested in another runs where it is called: its
    collectives are not its parent's, and `if rank == 0: sync()` calling a nested `sync` that holds a barrier
    is reported. An object made on some ranks only, `None` on the others (`stopper = Stopper() if rank == 0
    else None`, also kept on `self` from a constructor parameter a caller fills so, or a local bound only in a
    rank branch and to nothing elsewhere: `stopper = None`, then `if rank == 0: stopper = Stopper()`), makes
    `if stopper:` and `stopper is not None` rank tests; an attribute bound so in different methods
    (`self.stopper = None` in `__init__`, set under a rank test in another) is not followed. An entry of a
    list of ranks indexed by a variable (`opt.gpu_ranks[device_id]`) is this process's rank. A call through a
    dotted path of a project package (`import pkg.utils`, then `pkg.utils.comm.gather(...)`) is followed into
    the module it names. Calls through `getattr`, callables passed as arguments (a nested function handed to a
    library or to a parameter) and methods of objects of unknown class are unknown, never evidence. A
    torchmetrics metric is found by the names it is bound to in the file that makes it: one made by a function
    of another file and returned, or handed in as an argument, is not followed; a name that holds a metric
    somewhere in the file is taken to hold one wherever it is read, and a class chosen by `A if c else B` is a
    metric class when either is. The forward of a DDP-wrapped model is not taken as a collective: it
    broadcasts the module's buffers from rank 0 only when the module has buffers, `broadcast_buffers` is left
    True and the previous forward ran with gradients on (torch 2.13 `torch/nn/parallel/distributed.py`:
    `_pre_forward` calls `_sync_buffers()` when `_check_sync_bufs_pre_fwd()`, that is
    `will_sync_module_buffers()`: `require_forward_param_sync and broadcast_buffers and len(modules_buffers) >
    0`); whether a module has buffers is not visible in the source that calls it, and a rank-0 evaluation
    through a DDP model without buffers (nanoGPT's `estimate_loss()` under `master_process`) does not hang.

    A literal a call passes (or a literal default it leaves alone) is carried into the project function it
    calls and on through the parameters that function passes unchanged: `make_loader(val_set, rank=-1)`
    under `if rank in (-1, 0):` makes no collective when `make_loader` hands `rank` to a "main process
    first" helper whose barriers sit under `if local_rank not in (-1, 0):` and `if local_rank == 0:`. Only
    tests over the parameter itself are read (`==`, `!=`, `in`, `not in`, orderings, `is None`, a bare
    name, `not`/`and`/`or`, `p.startswith("x")`), up to where the function binds it again. An argument known
    not to be `None` (a non-`None` literal, a display, `Store(...)`, a loop over a `Sequence[Store]`
    parameter) rules out an `if store is None:` branch (a literal string, `if uri.startswith("s3://"):`),
    and with it the broadcast that only that branch reaches. An early exit that needs a flag the
    project declares (`self.stop = False` in a class of its own) and never sets to anything else, on any
    object, is not taken: `if callbacks.stop_training: return` under a rank test leaves no rank behind when
    nothing raises `stop_training` (a `setattr(self, name, value)` in the class keeps it unknown; one on
    another object with a computed name is not seen).

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
        score = expensive_metric(self.outputs)  # on every rank, over its own shard
        self.log("val_score", score, sync_dist=True)  # every rank syncs: the mean over the ranks
    ```
    or, for a value only rank 0 has, `self.log("val_score", score, rank_zero_only=True)` under the rank
    test: no sync, and what is logged is rank 0's value alone. For `torch.distributed` calls, call the
    collective on every rank and guard only the side effect (printing, saving).

    ## Fix safety
    Safe: `self.log(..., sync_dist=True)` (or `log_dict`) moves out of `if <rank test>:`, so that every rank
    logs it and the value is synced, as `sync_dist=True` asked. The other statements of the branch stay
    under the test. The move is offered only where it changes nothing else: the log is a statement of its
    own directly in the branch (no `else`, not an `elif`), among the first statements of the branch (it
    moves above the `if`) or the last (below it), not between two others; it reads constants, parameters,
    names assigned before the `if` on every path and nowhere else in the function, attributes and items of
    those, no call and no `self.<attr>` that the class sets under a rank test; and where it moves above the
    test (or the whole `if` goes), the test has no effect of its own. All the moved logs of one `if` are one
    edit, fixed together.

    Unsafe (`--unsafe-fixes`), where the move cannot be shown equivalent: `sync_dist=True` becomes
    `rank_zero_only=True`. The hang goes, but the logged value is rank 0's shard only, not the synced one;
    callbacks that monitor the metric on the other ranks (early stopping, checkpointing) do not see it, and
    Lightning warns about it. Other collectives have no automatic fix: where the call belongs depends on
    the program.

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
    triggers = (*TRIGGERS, STEP)  # (a Lightning step: the backward it ends in, lightning_steps.py)
    project_wide = True
    reads_rank_tests = True  # wanted where an attribute of another file's making is the rank test

    @classmethod
    def wanted_in_project(cls, text: str) -> bool:
        """With other files known, a call under a rank test may reach a collective in any of them."""
        return cls.wanted(text) or any(word in text for word in RANK_WORDS)

    def check(self, source: SourceFile) -> Iterator[Finding]:
        # An early exit is reported at the collectives the other ranks wait in (where the hang shows) and,
        # once, at the exit itself: the `break` or `return` is what the fix changes.
        left: dict[int, tuple[Guard, Finding]] = {}
        lines: set[int] = set()
        for guard, finding in self._collectives(source):
            yield finding
            lines.add(finding.locations[0].line or 0)
            if guard.early_exit and guard.exit_stmt is not None:
                left.setdefault(id(guard.exit_stmt), (guard, finding))
        for guard, first in left.values():
            assert guard.exit_stmt is not None
            if guard.exit_stmt.lineno not in lines:
                yield self._exit(source, guard, first)
        for skipped in skipped_steps(source):  # the backward Lightning runs after `training_step`
            yield self.finding(source, skipped.exit, skipped.message(source), fix=Fix(message=SKIP_FIX),
                               facts={"collective": "backward (gradient all-reduce)", "per_rank_data": bool(
                                   skipped.data), "guard_line": skipped.test.lineno})
        if source.project is not None:  # the other end of a call of another file, at the collective
            for reached in rank_only_callers(source.project, source.path, lambda other: (
                    f for g, f in self._collectives(other) if not (g.data or "by_layout" in f.facts))):
                calls = [c for c in source.calls if c.lineno == reached.collective.line]
                if calls and reached.collective.line not in lines:
                    lines.add(reached.collective.line)
                    yield self._reached(source, calls[0], reached)

    def _exit(self, source: SourceFile, guard: Guard, first: Finding) -> Finding:
        assert guard.exit_stmt is not None
        waited = first.facts.get("collective", "a collective")
        return self.finding(
            source, guard.exit_stmt,
            f"{guard.leaving} go on to `{waited}` (line {first.locations[0].line}) and wait there for them, "
            "so the job hangs",
            fix=Fix(message=guard.fix("take the decision on every rank before leaving (broadcast rank 0's "
                                     "decision, or decide from values reduced across the ranks)")),
            facts={"collective": waited, "guard_line": guard.line, "early_exit": True,
                   "collective_line": first.locations[0].line, "per_rank_data": bool(guard.data)},
        )

    def _collectives(self, source: SourceFile) -> Iterator[tuple[Guard, Finding]]:
        labels = CollectiveCalls(source)
        helpers = CollectiveFunctions(source, labels)
        flow = RankFlow(source, helpers.balanced, collectives=helpers.paths,
                        balanced_by_rest=helpers.balanced_by_rest,
                        data_tests=DataTests(source, lambda call: agreeing(call, labels)))
        groups = ConstantGroups(source)
        for guarded in flow.calls:
            guard = guarded.guard
            if guard is None:
                continue
            label = labels.label(guarded.call)
            if guard.trusted or groups.reaches_whole_group(guarded):
                continue
            test, within = (guard.branch.test if guard.branch is not None else None), guard.ranks.subgroup
            if label is not None:
                group = collective_group(guarded.call)
                if (test is None or not whole_groups(test, group, None, within)) and not made_only_under(
                        source, flow.calls, group, guard.ranks, test):  # (a group only guarded ranks make)
                    hedge = mesh_layout_hedge(source, test, group, label, guard)  # (a mesh group: hedged)
                    yield guard, self.finding(source, guarded.call, **hedge) if hedge else self._direct(
                        source, guarded, label, labels)
                continue
            target = helpers.resolve(guarded.call, guarded.cls)
            if target is None or helpers.issues(target) is None:
                far = helpers.elsewhere(guarded.call, guarded.cls)
                if far is None or source.project is None or test is not None and whole_groups(
                        test, chain_group(source.project, far[1]), guarded.call, within):
                    continue
                steps = (source.project.where(far[0]), *far[1])
                yield guard, self._through(source, guarded, steps)
                continue
            inner_label, inner_call = helpers.issues(target)  # type: ignore[misc]
            if test is not None and whole_groups(test, collective_group(inner_call), guarded.call, within):
                continue
            steps = helpers.chain(guarded.call, guarded.cls) or (
                Step(f"`{target.name}()`", source.path, target.lineno),
                Step(f"`{inner_label}`", source.path, inner_call.lineno))
            yield guard, self._through(source, guarded, steps)

    def _through(self, source: SourceFile, guarded: GuardedCall, steps: tuple[Step, ...]) -> Finding:
        assert guarded.guard is not None  # (a call handing a mesh group on, `group=replicate_group`: hedged)
        test = guarded.guard.branch.test if guarded.guard.branch is not None else None
        hedge = mesh_layout_hedge(source, test, collective_group(guarded.call), steps[-1].what.strip("`"),
                                  guarded.guard)
        return self.finding(source, guarded.call, **hedge) if hedge else self.finding(
            source,
            guarded.call,
            f"`{source.segment(guarded.call.func)}()` issues a collective, but only some ranks "
            f"{guarded.guard.may}call it ({guarded.guard.where()}); {guarded.guard.outcome('join')}: "
            f"{show_chain(steps)}",
            fix=Fix(message=guarded.guard.fix("call it on every rank, or move the collective out of it")),
            facts={
                "collective": steps[-1].what.strip("`"),
                "guard_line": guarded.guard.line,
                "via": " → ".join(step.show() for step in steps),
            },
        )

    def _reached(self, source: SourceFile, call: ast.Call, reached: RankOnlyCaller) -> Finding:
        return self.finding(source, call, reached.message(), facts=reached.facts(), fix=Fix(
            message="call it on every rank, or let that call skip the collective (a flag it passes)"))

    def _direct(self, source: SourceFile, guarded: GuardedCall, label: str,
                labels: CollectiveCalls) -> Finding:
        assert guarded.guard is not None
        fix = None
        if label.endswith("(sync_dist=True)"):
            fix = log_fix(source, guarded)
            shown = label.replace("(sync_dist=True)", "(..., sync_dist=True)")
            what = f"`{shown}` syncs the value across ranks"
        elif launch_dependent(label, labels):
            launch = LAUNCH_DEPENDENT[label.rsplit(".", 1)[-1]]
            return self.finding(
                source, guarded.call,
                f"`{label}` must run on every process, but only some ranks reach it "
                f"({guarded.guard.where()}): launched with DeepSpeed or FSDP ({launch.chosen_by}) it is a "
                f"collective and the job hangs; {launch.under_ddp}",
                fix=Fix(message=f"call it on every process ({launch.writer})"),
                facts={"collective": label, "guard_line": guarded.guard.line, "launch_dependent": True},
            )
        else:
            fix = Fix(message=guarded.guard.fix("call the collective on every rank, guard the side effect"))
            what = f"`{label}` is a collective"
        return self.finding(
            source, guarded.call,
            f"{what}, but only some ranks {guarded.guard.may}reach it "
            f"({guarded.guard.where()}); {guarded.guard.outcome()}",
            fix=fix, facts={"collective": label, "guard_line": guarded.guard.line},
        )

