"""The facts the project index is made of: functions and modules of the run, summarised, and the chains of
evidence the rules show ("`train()` (main.py:26) → `for … in loader` (main.py:28)")."""

from __future__ import annotations

import ast
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .constant_gates import Constant, Gate
from .flags import FlagBindings

if TYPE_CHECKING:
    from .attributes import AttributeBinding, RankArgument
    from .rank_sets import RankSet
    from .summaries import Returned

MAX_SHOWN_STEPS = 6


@dataclass(frozen=True, order=True)
class Target:
    """A function of the project: the file it is defined in and its name there (`f` or `Class.method`)."""

    path: str
    name: str


@dataclass(frozen=True)
class Step:
    """One link of the evidence: what happens, where."""

    what: str
    path: str
    line: int
    writer: str = ""  # a save step's writer (`os.makedirs`): what several processes doing it cause

    def show(self) -> str:
        return f"{self.what} ({os.path.basename(self.path)}:{self.line})"


def show_chain(steps: tuple[Step, ...]) -> str:
    if len(steps) > MAX_SHOWN_STEPS:
        hidden = len(steps) - MAX_SHOWN_STEPS + 1
        steps = (
            *steps[: MAX_SHOWN_STEPS - 2],
            Step(f"… {hidden} more calls …", steps[-2].path, steps[-2].line),
            steps[-1],
        )
        return " → ".join(s.show() if not s.what.startswith("…") else s.what for s in steps)
    return " → ".join(s.show() for s in steps)


@dataclass(frozen=True)
class Passed:
    """What a call passes, as far as a defaulted flag goes: how many positional arguments (a `*args` counts
    as many) and which keywords (`""` for a `**kwargs`)."""

    positional: int
    keywords: frozenset[str]

    @classmethod
    def of(cls, call: ast.Call) -> Passed:
        many = any(isinstance(a, ast.Starred) for a in call.args)
        return cls(1 << 16 if many else len(call.args), frozenset(k.arg or "" for k in call.keywords))

    def may_pass(self, flag: tuple[str, int]) -> bool:
        """Whether the parameter `flag` (name, position; -1: keyword-only) may be passed."""
        name, index = flag
        return bool(self.keywords & {name, ""}) or 0 <= index < self.positional


# `Cls.__super__.m`: the `m` that `super().m()` in `Cls` runs, the first base of `Cls` defining it (written by
# index.Resolver.callee, read by CallGraph.function)
SUPER = "__super__."


@dataclass(frozen=True)
class HelperTest:
    """A project function that an `if` test around a call calls (`if utils.is_primary(args):`): whether it
    tests the rank is known once the index is whole (helper_tests.py). `negated`: the call is in the
    else-branch of `if not helper():`. What the test passes (positional count, keywords) says whether a
    defaulted flag of the helper is left alone."""

    target: Target
    negated: bool
    passed: Passed


@dataclass(frozen=True)
class CallSite:
    """A call from one project function to another. `flows` pairs an argument (its position, or its keyword)
    with the caller's parameter passed there unchanged."""

    target: Target
    line: int
    guarded: bool  # under a rank test in the caller
    bound: bool  # `self.m(...)`: the callee's first parameter is the receiver
    flows: tuple[tuple[int | str, int], ...] = ()
    # arguments that hold what a project function returned, unchanged: (argument, that function, where in
    # its return the argument's value is: "" the whole, `[1]` the second of a tuple): `a, b = load(...)`
    # then `fit(a)`; for a project class, an object made by its constructor (`h = Handler(...)`, `fit(h)`)
    results: tuple[tuple[int | str, Target, str], ...] = ()
    # literal arguments (`rank=-1`), and what it gives by position and by keyword (None: `*args`/`**kw`, so
    # which defaults apply is unknown): with the callee's `defaults` and `gates` (constant_gates.py)
    constants: tuple[tuple[int | str, Constant], ...] = ()
    arity: tuple[int, tuple[str, ...]] | None = None
    # a nested function passed as an argument (`save_if_main(write, path)`: this site's target is `write`):
    # the function it is passed to, the argument, and whether that call is bound. It runs where that
    # function calls its parameter (`CallGraph` resolves it; nested.py)
    passed_to: tuple[Target, int | str, bool] | None = None
    # arguments that hold project functions' results inside a display: (argument, where in it, that
    # function, where in its return): `fit(loaders={"train": train_loader})` after `train_loader = build()`
    placed: tuple[tuple[int | str, str, Target, str], ...] = ()
    # arguments that are the caller's own parameter or a part of it: (argument, the caller's parameter,
    # where in it): `fit(loader)`, `Pipeline(train=loaders["train"])`, `x: DataLoader = loaders["train"]`
    parts: tuple[tuple[int | str, int, str], ...] = ()
    helper_tests: tuple[HelperTest, ...] = ()  # the project functions its `if` tests call (helper_tests.py)


@dataclass(frozen=True)
class FunctionSummary:
    name: str
    line: int
    params: tuple[str, ...]
    collective: Step | None  # the first collective it issues itself
    save: Step | None  # a `torch.save` to a shared path outside any rank test
    # (parameter index, what the loop takes from it (`['train']`, or "" for the parameter itself), line)
    iterates: tuple[tuple[int, str, int], ...]
    calls: tuple[CallSite, ...]
    rank_zero_only: bool  # decorated `@rank_zero_only` & co.: runs on one rank by construction
    returns_loader: Step | None = None  # returns a DataLoader over a shuffling DistributedSampler
    # where the loader is in what it returns: "" (the value itself), "[0]" (a tuple's first), "['train']"
    loader_suffixes: tuple[str, ...] = ()
    # a method: the `self` paths it iterates, itself or through `self.m()` calls, with the chain
    self_iterates: tuple[tuple[str, tuple[Step, ...]], ...] = ()
    # `__init__`: a constructor parameter (index, `self` counted) that an epoch loop of the class walks
    # (what it takes from it, and the chain from the loop)
    epoch_params: tuple[tuple[int, str, tuple[Step, ...]], ...] = ()
    keeps: tuple[tuple[str, int], ...] = ()  # `__init__`: `self.x = param` (attribute, parameter index)
    # parameters whose tensor a torch.distributed collective takes: (index, "" for the parameter itself or
    # "*" for its elements (`for v in stats.values(): all_reduce(v)`), the collective)
    collective_params: tuple[tuple[int, str, Step], ...] = ()
    returns_cpu: Step | None = None  # every `return` gives a CPU tensor (`return torch.tensor(x)`)
    returned: Returned | None = None  # what it returns in the rank domain (summaries.py)
    # a factory: every `return` makes an object of "cls" (the class it is called on) or of one of these
    # classes, named as the file holds them (`@classmethod def from_config(cls, cfg): return cls(...)`,
    # `def load_model(args): return globals()[args.agent](args)`: any class of the module)
    returns_classes: tuple[str, ...] = ()
    forwards: Target | None = None  # `return build(...)`: it returns what that project function returns
    passes_through: tuple[int, ...] = ()  # parameters it may return as they are (or `tqdm(p)`)
    # loops over what a project function gives back for a parameter: `for x in wrap(loader, ...)` is
    # (parameter, that function, the argument position, line), a loop over the parameter when `wrap` passes
    # that argument through
    iterates_via: tuple[tuple[int, Target, int, int], ...] = ()
    returns_wrapper: str | None = None  # may return a model wrapper (model_wrappers.Wrapper's value)
    # parameters it runs a pass of: `model(x)`, `model.forward(x)`, `model.generate(x)` on the parameter
    runs_params: tuple[int, ...] = ()
    defaults: tuple[tuple[int, Constant], ...] = ()  # literal defaults of its parameters (index, value)
    gates: tuple[Gate, ...] = ()  # what a constant parameter turns off (constant_gates.py)
    # parameters it calls (`fn(path)`), each with whether that call is under a rank test
    calls_params: tuple[tuple[int, bool], ...] = ()
    # nested functions it passes to project functions, not yet resolved to where they run (nested.py)
    passes: tuple[CallSite, ...] = ()
    collective_group: str | None = None  # the named group `collective` runs on, None: the default one
    rank_gate: RankSet | None = None  # a decorator running what it decorates on these ranks (decorators.py)


@dataclass(frozen=True)
class ModuleSummary:
    path: str
    functions: dict[str, FunctionSummary]
    imports: frozenset[str]  # project files this module imports
    set_epoch: bool  # calls `.set_epoch(...)` somewhere
    trains: bool  # calls `.backward(` somewhere: training code
    framework: bool  # Lightning, accelerate, HF Trainer, DeepSpeed...: they call set_epoch themselves
    inits: tuple[BackendInit, ...]
    samplers: bool  # mentions DistributedSampler
    collectives: bool  # calls a torch.distributed collective that moves tensors
    manual_ddp: bool  # a hand-written DDP script (SourceFile.manual_ddp)
    stars: frozenset[str] = frozenset()  # project modules it imports with `from x import *`
    # attributes assigned a loader over a (maybe) shuffling DistributedSampler (`self.train_loader = ...`)
    loader_attributes: tuple[tuple[str, int], ...] = ()
    launched: bool = False  # shows a marker of a distributed program (program.launched)
    makes_group: bool = False  # makes the default process group itself (program.makes_group)
    # builds a Lightning `Trainer` that runs the script once per process (program.lightning_runs_every_rank)
    lightning_processes: bool = False
    asks_program: bool = False  # a rule that asks whether the program is distributed wants this file
    attributes: tuple[AttributeBinding, ...] = ()  # `self.x = ...`, `args.x = ...` in the rank domain
    rank_arguments: tuple[RankArgument, ...] = ()  # project calls passing a rank value or test
    tested_attributes: frozenset[str] = frozenset()  # attributes its `if` tests read (`if args.main:`)
    shards: bool = False  # splits a dataset between the ranks itself (`dataset.shard(world_size, rank)`)
    # project files its imports may name though they do not resolve from its folder (`sys.path` additions)
    maybe_imports: frozenset[str] = frozenset()
    keeps_buffers: bool = False  # defines modules with buffers (model_wrappers.keeps_buffers)
    flags: FlagBindings = FlagBindings()  # attributes declared as flags, and those bound otherwise (flags.py)
    main_block: tuple[int, int] | None = None  # lines of its `if __name__ == "__main__":` (scripts.py)
    metric_classes: frozenset[str] = frozenset()  # classes deriving from torchmetrics' (metric_objects.py)
    # LightningModules and DDP-wrapped classes: their modules live on each rank's device (DDP402)
    device_managed: frozenset[str] = frozenset()
    passes_closures: bool = False  # some function passes a nested function to a project function
    helper_tested: bool = False  # some call is under an `if` calling a project function (helper_tests.py)
    # its functions that module-level code hands by name to a call (`fire.Fire(main)`), with the call's line
    handed_on: tuple[tuple[str, int], ...] = ()
    # scripts its strings start on several nodes (`--nnodes={n} ... train.py`), with the line (scripts.py)
    node_launches: tuple[tuple[str, int], ...] = ()
    pipeline: bool = False  # makes a DeepSpeed `PipelineModule` (pipeline_stages.builds_pipeline)
    # epoch-end hooks a LightningModule of it hands to an attribute's method of that name (delegated_hooks)
    delegated_hooks: frozenset[str] = frozenset()


@dataclass(frozen=True)
class BackendInit:
    """An `init_process_group` whose default group has backends for CUDA only (or may have)."""

    path: str
    line: int
    how: str  # how the backend was determined, for the message
    hedged: bool  # only on some hosts or in some branches

