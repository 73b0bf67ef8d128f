"""Which calls run on only some ranks: one structured walk over a file that tracks rank guards.

A call is rank-guarded when it sits in a branch of an `if` on a rank condition (see `ranks.py`), in a
function decorated with `rank_zero_only` (or accelerate's `on_main_process` family), or after a rank
branch that lets its ranks leave: a `continue`, `break`, `return` or `sys.exit()` anywhere inside
`if rank == 0:` makes rank 0 skip the rest of the loop body or function, so what follows runs on the other
ranks only (after a `break` or `return`, the collectives earlier in the same loop body too: the leaving
ranks miss every later iteration). A `raise` is not such an exit: the process dies and the launcher stops
the job with the error, so a validation under a rank test (`if rank == 0 and not exists(p): raise`)
guards nothing.

An `if` whose two branches issue the same collectives, in the same order, does not guard them: every
rank still makes the same calls (`if main: x = gather(t); log(x) else: gather(t)`). A rank test inside an
expression (`src = 0 if rank == 0 else None`) only chooses a value and guards nothing.

Each guard carries the `RankSet` of the processes that run what it guards (`ranks.py`): DDP101 needs to
know that it is not every rank, DDP601 that it is at most one process per node.
"""

from __future__ import annotations

import ast
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from .data_exits import DATA_FIX, DataTests, may_read
from .decorators import decorator_gate
from .exits import (  # noqa: F401
    EXIT_FUNCTIONS,
    Exits,
    Leave,
    _exit_word,
    branch_calls,
    continuing,
    exits,
    failure_raise,
    is_exit_call,
    terminates,
)
from .rank_classes import balanced_classes
from .rank_pairs import WalkPaths, paired_across
from .rank_parameters import bind, passed_ranks
from .rank_sources import (  # noqa: F401
    RANK_WORDS,
    RANK_ZERO_DECORATORS,
    Function,
    _decorator_name,
    rank_zero_decorator,
)
from .ranks import ALL, SOME, RankNames, RankSet, RankTest, meet
from .source import SourceFile, child_nodes
from .summaries import RankReturns


@dataclass(frozen=True)
class Guard:
    """Why a call runs on some ranks only: the rank test (or decorator) and where it is."""

    node: ast.AST
    description: str
    line: int
    branch: ast.If | None = None  # the `if` whose branch (or early exit) this is
    # Inside an `if` whose branches were found balanced: nested rank tests are part of that protocol
    # (`if rank == src: ... else: ...` around per-peer sends), so they guard nothing either.
    trusted: bool = False
    early_exit: bool = False  # some ranks left at an exit under this test (`if rank != 0: return`)
    ranks: RankSet = SOME  # the processes that run what this guards
    leaves: Leave = Leave.FUNCTION
    exit_stmt: ast.stmt | None = None  # the first exit, where DDP101 also reports (what the fix changes)
    data: str = ""  # the per-rank value an early exit's test reads, no rank named (data_exits.py): hedged

    @property
    def exit_word(self) -> str:
        return _exit_word(self.exit_stmt) if self.exit_stmt is not None else ""

    def where(self) -> str:
        if self.data and self.exit_stmt is not None:
            return (f"ranks may leave early: `{self.exit_word}` at line {self.exit_stmt.lineno}, under "
                    f"`{self.description}` (line {self.line}): it reads {self.data}")
        if self.early_exit and self.exit_stmt is not None:
            return (f"some ranks leave early: `{self.exit_word}` at line {self.exit_stmt.lineno}, under "
                    f"`{self.description}` (line {self.line})")
        prefix = "" if self.description.startswith("@") else "inside "
        reads = f", which reads {self.data}" if self.data else ""  # a branch on per-rank data
        return f"{prefix}`{self.description}`, line {self.line}{reads}"

    @property
    def leaving(self) -> str:
        """DDP101's words for the exit itself, up to the ranks that stay."""
        if not self.data:
            return (f"`{self.exit_word}` lets only some ranks leave (under `{self.description}`, line "
                    f"{self.line}); the others")
        return (f"`{self.exit_word}` may let only some ranks leave: `{self.description}` (line {self.line}) "
                f"reads {self.data}; where it holds on some ranks only, the others")

    # An early exit on per-rank data is hedged: no rank is named, the value only may differ between ranks.
    @property
    def may(self) -> str:
        return "may " if self.data else ""

    def outcome(self, verb: str = "call") -> str:
        if self.data:
            away = "left" if self.early_exit else "go the other way"
            return (f"where that value differs between ranks, those that {away} never {verb} it: the others "
                    "wait")
        return f"the other ranks never {verb} it, so the job hangs"

    def fix(self, otherwise: str) -> str:
        return DATA_FIX if self.data else otherwise

    @property
    def one_writer_per_node(self) -> bool:
        return self.trusted or self.ranks.one_writer_per_node


@dataclass(frozen=True)
class GuardedCall:
    call: ast.Call
    guard: Guard | None
    function: Function | None
    cls: ast.ClassDef | None


class RankFlow:
    """Walk a file once; `calls` lists the calls with the rank guard each runs under (or None).

    `balanced(if_stmt, cls)` says whether both branches of a rank test make the same collectives (then
    they guard nothing); `collectives(stmts, cls)`, when given, the set of collective sequences a block can
    make, used to pair complementary rank tests. With `skip_unranked` (the default) only calls that can be
    guarded are listed; without it, every call of the file.
    """

    def __init__(
        self,
        source: SourceFile,
        balanced: Callable[[ast.If, ast.ClassDef | None], bool],
        skip_unranked: bool = True,
        collectives: WalkPaths | None = None,
        balanced_by_rest: Callable[[ast.If, list[ast.stmt], ast.ClassDef | None], bool] | None = None,
        data_tests: DataTests | None = None,
    ):
        self.source = source
        self.collectives = collectives
        self.balanced_by_rest = balanced_by_rest
        # With `data_tests` (DDP101), an early exit under a test of per-rank data lets some ranks leave too.
        self.data_tests = data_tests
        self._paired: set[int] = set()
        # With skip_unranked, only what can be guarded is visited: functions without rank words are
        # skipped, and calls outside any guard are not recorded (DDP101 needs only the guarded ones).
        self.skip_unranked = skip_unranked
        self.balanced = balanced
        self.calls: list[GuardedCall] = []
        self._function: Function | None = None
        self._class: ast.ClassDef | None = None
        helpers = RankReturns(source) if source.project else None
        # flags the project never raises (flags.py): the index knows them once the file's summary is in it
        self._never = source.project.never_raised_flags if source.project else frozenset()
        module_names = RankNames(source.tree.body, helpers=helpers)
        # A function body can only hold guarded calls if its text mentions something rank-like (an
        # attribute that holds a rank somewhere in the project included).
        self._rank_words = (*RANK_WORDS, *module_names.values, *module_names.flags,
                            *(helpers.words if helpers is not None else ()))
        self._block(source.tree.body, None, module_names)

    def _describe(self, node: ast.AST, prefix: str, branch: ast.If | None = None,
                  ranks: RankSet = SOME) -> Guard:
        text = self.source.segment(node).split("\n", 1)[0]
        if len(text) > 60:
            text = text[:57] + "..."
        return Guard(node, f"{prefix}{text}", node.lineno, branch, ranks=ranks)  # type: ignore[attr-defined]

    def _block(self, stmts: list[ast.stmt], guard: Guard | None, names: RankNames) -> Guard | None:
        """Walk a block; return the early-exit guard that started in it and holds for what follows it."""
        if guard is None and self.collectives is not None:
            self._pair_complementary(stmts, names)
        escaping: Guard | None = None
        for i, stmt in enumerate(stmts):
            found: Guard | None = None
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
                self._enter_function(stmt, names)
            elif isinstance(stmt, ast.ClassDef):
                self._expressions(stmt.decorator_list + stmt.bases, guard)
                outer, self._class = self._class, stmt
                self._block(stmt.body, guard, names)
                self._class = outer
            elif isinstance(stmt, ast.If):
                if guard is None and self.balanced_by_rest is not None and not stmt.orelse and terminates(
                        stmt.body) and names.test(stmt.test).is_rank_test and self.balanced_by_rest(
                        stmt, stmts[i + 1:], self._class):
                    self._paired.add(id(stmt))  # the ranks it sends away make what the others make after it
                found = self._if(stmt, guard, names)
            elif isinstance(stmt, (ast.For, ast.AsyncFor, ast.While)):
                found = self._loop(stmt, guard, names)
            else:
                found = self._statement(stmt, guard, names)
            if guard is None and found is not None:
                guard = escaping = found
        return escaping

    def _pair_complementary(self, stmts: list[ast.stmt], names: RankNames) -> None:
        """`if local_rank not in (-1, 0): barrier()` ... `if local_rank == 0: barrier()`: two rank tests in
        one
        block, with different conditions, making the same collectives. This is the "main process first"
        idiom (the others wait at the first barrier, rank 0 at the second); each rank makes the call once."""
        candidates = [s for s in stmts if isinstance(s, ast.If) and not s.orelse
                      and names.test(s.test).is_rank_test]
        assert self.collectives is not None
        if candidates:  # the second half nested in later branches (rank_pairs.py)
            self._paired |= paired_across(stmts, names, self.collectives, self._class)
        if len(candidates) < 2:
            return
        groups: dict[frozenset, list[ast.If]] = {}
        for stmt in candidates:
            paths = self.collectives(stmt.body, self._class, None)
            if paths and any(p for p in paths):
                groups.setdefault(paths, []).append(stmt)
        for group in groups.values():
            tests = [(stmt, names.test(stmt.test)) for stmt in group]
            for stmt, test in tests:
                # Complementary tests: what one lets through, the other holds back (`local_rank not in (-1,
                # 0)`
                # and `local_rank == 0`); two tests of different sets (`rank == 0`, `node_rank == 0`) are not.
                if any(other is not stmt and ast.dump(other.test) != ast.dump(stmt.test)
                       and test.then.kind == mirror.orelse.kind and test.orelse.kind == mirror.then.kind
                       for other, mirror in tests):
                    self._paired.add(id(stmt))

    def _if(self, stmt: ast.If, guard: Guard | None, names: RankNames) -> Guard | None:
        self._expressions([stmt.test], guard)
        test = names.test(stmt.test)
        if guard is not None:
            if guard.trusted or not test.is_rank_test:
                self._block(stmt.body, guard, names)
                self._block(stmt.orelse, guard, names)
            else:  # a rank test inside a rank branch narrows who runs each side
                self._block(stmt.body, dataclasses.replace(guard, ranks=meet(guard.ranks, test.then)), names)
                self._block(
                    stmt.orelse, dataclasses.replace(guard, ranks=meet(guard.ranks, test.orelse)), names
                )
            return None
        if not test.is_rank_test:
            within = self._data_branch(stmt, names)  # collectives inside a branch on per-rank data: hedged
            inner = [self._block(stmt.body, within, names), self._block(stmt.orelse, within, names)]
            escaping = next((g for g in inner if g is not None), None)
            if escaping is None and self.data_tests is not None:
                return self._data_exit(stmt)
            # Only when this test holds do the leaving ranks leave: afterwards, who goes on is unknown.
            return dataclasses.replace(escaping, ranks=SOME) if escaping is not None else None
        if id(stmt) in self._paired or self.balanced(stmt, self._class):
            trusted = Guard(stmt.test, "", stmt.lineno, stmt, trusted=True, ranks=ALL)
            self._block(stmt.body, trusted, names)
            self._block(stmt.orelse, trusted, names)
            return None
        here = self._describe(stmt.test, "if ", stmt)
        self._block(
            stmt.body, dataclasses.replace(here, ranks=test.then) if test.then.restricted else None, names
        )
        self._block(
            stmt.orelse,
            dataclasses.replace(here, ranks=test.orelse) if test.orelse.restricted else None,
            names,
        )
        body, orelse = exits(stmt.body, self._never), exits(stmt.orelse, self._never)
        rest = continuing(test, body, orelse)
        if rest is None:
            return self._failure_exit(stmt, here, test) if not (body.always and orelse.always) else None
        leaving = [e for e in (body, orelse) if e.first is not None and e.leaves is not None]
        first = min((e.first for e in leaving if e.first is not None), key=lambda s: s.lineno)
        return dataclasses.replace(
            here, early_exit=True, ranks=rest, exit_stmt=first,
            leaves=max(e.leaves for e in leaving if e.leaves is not None))

    def _data_branch(self, stmt: ast.If, names: RankNames) -> Guard | None:
        """A test of the file system (data_exits.py) around collectives its branches do not make alike: only
        the ranks where it holds (or fails) make them (other per-rank data: exits only). Not where a branch
        tests the rank itself: a protocol of rank tests (rank 0 writes the cache the others find after a
        barrier) is judged by them. DDP101 only."""
        data = self.data_tests.describe(stmt.test, self._function, files_only=True) if (
            self.data_tests is not None) else None
        if not data or self.balanced(stmt, self._class) or any(
                isinstance(node, (ast.If, ast.Assert)) and names.test(node.test).is_rank_test
                for node in ast.walk(stmt) if node is not stmt):
            return None
        return dataclasses.replace(self._describe(stmt.test, "if ", stmt), ranks=SOME, data=data)

    def _failure_exit(self, stmt: ast.If, here: Guard, test: RankTest) -> Guard | None:
        """`if first_replica: try: download() except ...: raise`: the ranks whose work failed leave (hedged;
        exits.failure_raise), where no other exit decides who goes on. DDP101 only (`data_tests`)."""
        raised = self.data_tests is not None and (test.then.restricted and failure_raise(stmt.body) or (
            test.orelse.restricted and failure_raise(stmt.orelse)))
        if not raised:
            return None
        return dataclasses.replace(here, early_exit=True, ranks=SOME, exit_stmt=raised, leaves=Leave.FUNCTION,
                                   data="whether the work of the `try` inside failed on this rank")

    def _data_exit(self, stmt: ast.If) -> Guard | None:
        """One side of a test over per-rank data may leave (data_exits.py): the ranks where it holds do."""
        assert self.data_tests is not None
        body, orelse = exits(stmt.body, self._never), exits(stmt.orelse, self._never)
        if body.any == orelse.any:
            return None  # no exit, or both sides leave (on a decision they share, or the rest is dead)
        data = self.data_tests.describe(stmt.test, self._function)
        leaving = body if body.any else orelse
        if data is None or leaving.leaves is None:
            return None
        return dataclasses.replace(self._describe(stmt.test, "if ", stmt), early_exit=True, ranks=SOME,
                                   exit_stmt=leaving.first, leaves=leaving.leaves, data=data)

    def _loop(
        self, stmt: ast.For | ast.AsyncFor | ast.While, guard: Guard | None, names: RankNames
    ) -> Guard | None:
        self._expressions(
            [stmt.target, stmt.iter] if isinstance(stmt, (ast.For, ast.AsyncFor)) else [stmt.test], guard
        )
        mark = len(self.calls)
        inner = self._block(stmt.body, guard, names)
        if inner is not None and inner.leaves >= Leave.LOOP:
            # The ranks that broke out (or returned) miss every later iteration: the collectives before
            # the exit are theirs to skip as well. Walk the body again under that guard.
            del self.calls[mark:]
            self._block(stmt.body, inner, names)
        after = self._block(stmt.orelse, guard, names)
        escaping = inner if inner is not None and inner.leaves == Leave.FUNCTION else after
        # The loop may run no iteration: who goes on afterwards is unknown.
        return dataclasses.replace(escaping, ranks=SOME) if escaping is not None else None

    def _statement(self, stmt: ast.stmt, guard: Guard | None, names: RankNames) -> Guard | None:
        escaping: Guard | None = None
        for field, value in ast.iter_fields(stmt):
            if isinstance(value, list):
                if not value:
                    continue
                if isinstance(value[0], ast.stmt):
                    found = self._block(value, guard, names)
                    if found is not None and escaping is None:
                        # A `with` or `try` body runs whole; an `else`/`finally` block maybe not.
                        escaping = found if field == "body" else dataclasses.replace(found, ranks=SOME)
                elif isinstance(value[0], ast.excepthandler):
                    for handler in value:
                        self._expressions([handler.type] if handler.type else [], guard)
                        found = self._block(handler.body, guard, names)
                        if found is not None and escaping is None:
                            escaping = dataclasses.replace(found, ranks=SOME)
                elif isinstance(value[0], ast.match_case):
                    for case in value:
                        found = self._block(case.body, guard, names)
                        if found is not None and escaping is None:
                            escaping = dataclasses.replace(found, ranks=SOME)
                elif isinstance(value[0], ast.withitem):
                    self._expressions([item.context_expr for item in value], guard)
                elif isinstance(value[0], ast.expr):
                    self._expressions(value, guard)
            elif isinstance(value, ast.expr):
                self._expressions([value], guard)
        return escaping

    def _expressions(self, nodes: list[ast.expr], guard: Guard | None) -> None:
        if guard is None and self.skip_unranked:
            return
        stack: list[ast.AST] = list(nodes)
        while stack:
            node = stack.pop()
            if isinstance(node, ast.Lambda):
                continue  # runs later, wherever it is called
            if isinstance(node, ast.Call):
                self.calls.append(GuardedCall(node, guard, self._function, self._class))
            stack.extend(child_nodes(node))

    def _enter_function(self, func: Function, names: RankNames) -> None:
        self._expressions(func.decorator_list, None)
        deco = rank_zero_decorator(func)
        guard = (
            self._describe(deco, "@", ranks=RANK_ZERO_DECORATORS[_decorator_name(deco)])
            if deco is not None
            else None
        )
        if guard is None and func.decorator_list and (gated := decorator_gate(self.source, func, names)):
            guard = self._describe(gated[0], "@", ranks=gated[1])  # a project decorator's own rank test
        ranked = True  # (a function read only for its tests of per-rank data has no rank test to pair)
        passed = passed_ranks(self.source, self._function, self._class, func)  # what the project's calls pass
        if guard is None and self.skip_unranked:
            text = self.source.text_of(func)
            ranked = bool(passed) or any(word in text for word in self._rank_words)
            if not ranked and not (self.data_tests is not None and may_read(text)):
                return
        outer_function, outer_class = self._function, self._class
        self._function, self._class = func, outer_class
        inner = RankNames(func.body, names)
        # Parameters shadow module-level rank variables (a parameter called `rank` is still a rank).
        for arg in (*func.args.posonlyargs, *func.args.args, *func.args.kwonlyargs):
            if arg.arg in names.values or arg.arg in names.flags:
                inner.values.pop(arg.arg, None)
                inner.flags.pop(arg.arg, None)
        bind(inner, passed)
        if guard is None and self.collectives is not None and ranked:  # tests balanced across the function
            self._paired |= balanced_classes(func, inner, self.collectives, self._class)
        self._block(func.body, guard, inner)
        self._function, self._class = outer_function, outer_class
