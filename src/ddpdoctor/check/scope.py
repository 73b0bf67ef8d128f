"""One function (or a module's top level) while its file is summarised: what it is and what it was seen
to do, before it becomes a frozen `FunctionSummary`."""

from __future__ import annotations

import ast
from dataclasses import dataclass

from .facts import CallSite, Step, Target
from .guards import Function, rank_zero_decorator

MODULE = "<module>"  # the calls of a file's top-level code: no function, never a call target


def _param_names(func: Function) -> tuple[str, ...]:
    args = func.args
    return tuple(a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs))



@dataclass
class _Scope:
    name: str
    line: int
    end: int
    cls: str | None
    params: tuple[str, ...]
    rank_zero_only: bool
    collective: Step | None = None
    collective_group: str | None = None  # the named group it runs on (subgroups.py)
    save: Step | None = None
    returns_loader: Step | None = None
    loader_suffixes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        self.position = {name: i for i, name in enumerate(self.params)}
        self.calls: list[CallSite] = []
        self.iterates: list[tuple[int, str, int]] = []
        self.objects: dict[str, Target] = {}
        self.bindings: dict[str, int] = {}  # how many assignments bind each name here
        self.results: dict[str, tuple[Target, str]] = {}  # `a, b = load()`: `b` is `load()`'s `[1]`
        self.parts: dict[str, tuple[int, str] | None] = {}  # `train = loaders["train"]`: part of a parameter
        self.displays: dict[str, ast.expr] = {}  # `loaders = {"train": loader}`: bound once to a display
        self.self_iterates: tuple[tuple[str, tuple[Step, ...]], ...] = ()
        self.epoch_params: tuple[tuple[int, str, tuple[Step, ...]], ...] = ()
        self.keeps: tuple[tuple[str, int], ...] = ()
        self.collective_params: list[tuple[int, str, Step]] = []
        self.returns_cpu: Step | None = None
        self.forwards: Target | None = None
        self.passes_through: set[int] = set()
        self.iterates_via: list[tuple[int, Target, int, int]] = []
        self.returns_wrapper: str | None = None
        self.runs_params: set[int] = set()
        self.calls_params: set[tuple[int, bool]] = set()  # (parameter called, under a rank test)
        self.passes: list[CallSite] = []  # nested functions passed to project functions (nested.py)
        self.parent: _Scope | None = None  # a nested function's: the scope of the function defining it



def _scope(func: Function, name: str, cls: str | None) -> _Scope:
    return _Scope(name, func.lineno, func.end_lineno or func.lineno, cls, _param_names(func),
                  rank_zero_decorator(func) is not None)


def _short(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= 40 else text[:37] + "..."

