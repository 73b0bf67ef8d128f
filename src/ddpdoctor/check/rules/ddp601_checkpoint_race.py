from __future__ import annotations

import ast
from collections.abc import Iterator

from ...findings import Finding, Fix, Severity
from ..every_rank import EveryRank
from ..guards import Guard, GuardedCall, RankFlow
from ..keyword_gates import gate_misses
from ..program import LAUNCH_WORDS, accelerate_trains, lightning_runs_every_rank, other_framework_program
from ..project import ProjectIndex, Target, show_chain
from ..rank_paths import holds_rank
from ..ranks import Ranks
from ..registry import Rule, register
from ..save_sites import shared_save
from ..scripts import launched_on_nodes, own_script_block
from ..source import SourceFile, wiring_framework
from ..summarize import WRITE_WORDS
from ..writes import checkpoint_write, destination, race, shared_destination


@register
class CheckpointRace(Rule):
    """
    ## What it does
    Finds a checkpoint write that more than one process per node runs — `torch.save(obj, path)`,
    `torch.jit.save`, a TorchScript module's `.save(path)` (`torch.jit.script(model)` / `trace`),
    safetensors' `save_file`/`save_model`, a copy to a checkpoint's name (`shutil.copyfile(src, "best.pt")`,
    `copy`, `copy2`), a copy of a whole directory (`shutil.copytree`, the run's checkpoints with it), a file
    opened for writing text under a checkpoint's name, or a configuration's in a checkpoint folder
    (`open(path, "w")` of `train_params.yaml` in a path built from a name holding `checkpoint` or `ckpt`:
    what a converter or the next run reads back; also `Path(p).open("w")` and a file-system object's
    `open(path, "w")`: iopath's `PathManager`, `fsspec`) — in a hand-written DDP script (one that calls
    `init_process_group` or uses `DistributedDataParallel`) or a module linked by imports to one (a trainer
    module whose script or base class wraps the model; not a module Lightning or accelerate drives — an
    import of their utility modules, `accelerate.utils`, `lightning.pytorch.utilities`, wires nothing and
    does not make one — and not a sibling script that only shares a helper module), or in a module that
    `accelerate launch` runs on every process (it imports accelerate and uses its multi-process API:
    `accelerator.backward`, `wait_for_everyone`, `is_main_process`, ...; `accelerator.save` and
    `save_state` write once and are not writes here), when the path does not depend on the rank: a save
    outside any rank guard, or under a guard that lets several processes
    through — a node rank (`if args.nr == 0:` or `node_rank == 0` holds on every process of that node),
    `rank != 0`, `rank < 4`. One writer per node is accepted: global rank 0, `local_rank == 0`,
    `args.rank % ngpus_per_node == 0`, `gpu == 0` (the local device index), `is_local_main_process`,
    `not distributed or rank == 0`, and the code after `if rank != 0: return` — unless a file of the
    project starts the script on several machines (a launcher whose strings pass `--nnodes={n}` or
    `--node_rank={i}` and name the script, `... torch.distributed.launch {flags} train.py`): then one
    process per node is one writer per machine, all on the same path when the machines share the run
    directory, and a call under such a test to a helper of the same file that saves is reported at the
    call. A helper of the same file
    that saves counts as run on every rank when some caller runs it outside such a guard.

    A Lightning script is checked too when its `Trainer` may run the whole script once per process: a
    relaunching strategy (`strategy="ddp"`), several devices or nodes (`devices=4`, `num_nodes=2`), or a
    process count the command line picks (`Trainer.from_argparse_args(args)`, `devices=args.devices`,
    `Trainer(**config)`). Then a `torch.save` after `trainer.fit(...)` runs on every rank; one under
    `if trainer.is_global_zero:` / `trainer.global_rank == 0` or in a `@rank_zero_only` function does not,
    and `trainer.save_checkpoint` writes from one rank itself. Lightning Fabric alike (`Fabric(devices=2,
    strategy="ddp")`): `fabric.launch(main)` runs `main` in every process; `fabric.save` writes once.

    Other writes to a shared name count too: moving a checkpoint (`os.rename`, `os.replace`, `shutil.move`
    of a checkpoint's name: all but the first process find it gone), and `os.makedirs(d)` without `exist_ok`
    in the body of `if not os.path.exists(d):` (check, then create: the loser of the race raises
    FileExistsError). A path with a part new at each call (`uuid4()`, `mkstemp()`, `os.getpid()`, `with
    tempfile.NamedTemporaryFile() as tmp`) or a `get_*_rank(s)()` value is each process's own. A library
    method that trains under accelerate itself (its own `Accelerator()`) and saves runs on every rank when a
    script of another module calls it, also as `Embedder().fit(...)` (a method called on a new object is
    followed like one on a name bound to it).

    transformers' `save_pretrained(directory)` is a save too, in the same programs (and in a Hugging Face
    `Trainer` script, which torchrun runs on every process): a model's writes unless it is given
    `is_main_process=False` (the default is `True`), a tokenizer's always. `trainer.save_model(...)` writes
    from the main process only and is not reported, nor is a `save_pretrained` given `is_main_process=`;
    `self.save_pretrained(...)` of a class's own method of that name is judged by the method's body.

    The save may be in a helper of another module: an unguarded call in the script to a function that (itself
    or through the functions it calls, outside their own rank tests) writes to a shared path is reported at
    the call, with the chain (`` `save_checkpoint()` (checkpoint.py:6) → `torch.save(…, os.path.join(...))`
    (checkpoint.py:9) ``). Methods are followed too: `self.save(...)`, a method of an object made in the same
    function (`ckpt = Checkpointer(...); ckpt.save(...)`), of an object the class keeps on `self` (`self.ckpt
    = Checkpointer(dir)`), of an object a factory made (`trainer = Trainer.from_config(cfg)`; `agent =
    load_agent(cfg)` whose every `return` makes an object of a project class, `return Agent(...)` or `agent =
    Agent(...); return agent`; `globals()[name](...)`, one of the classes its module holds: the first by name
    that has the method), of a class re-exported by a package's `__init__`, and of an object passed in as a
    parameter when every caller that passes a known object passes one of the same project class (`handler =
    Handler(dir)` in `run.py`, then `train(model, handler=handler)`, and `handler.save(...)` in `train()`).

    A function nested in another (a `def` inside a function) runs where it is called, not where it is
    defined: called by its parent, under the guard of that call, with the call's arguments (`def
    one_step(step_id): if step_id > 0: torch.save(...)` called as `one_step(i)` in the loop saves on every
    rank: `step_id` is a step, not a rank); passed to a project function (`save_if_main(write, path)`),
    where that function calls its parameter (`if accelerator.is_main_process: fn(path)` runs it on one
    process; `fn(path)` outside a rank test, on every rank that calls it), followed through the functions
    it is passed on to. Passed to anything else, or never called, its saves are not evidence.

    What runs on every rank: module-level code (a script's `if __name__ == "__main__":` block only when the
    run it starts is distributed: the script makes the process group or shows a DDP or launcher marker itself,
    or its block reaches, through project functions, a module that makes the group or that a launcher drives;
    a tool run by hand beside the training script, `python export.py` or a benchmark of a save helper, starts
    one process), functions passed by name from code that runs on every rank (`mp.spawn(main)`,
    `fire.Fire(main)`, also when asked from another file: a helper `main` calls runs on every rank; not a
    nested function handed to a compiler by a helper nothing calls; the function that calls `mp.spawn` is the
    parent process, run once, and so is what it calls: its own writes before or after starting the workers
    have one writer), and functions called outside any one-writer rank test from those — in the same file, or
    from any file of the project (`train()` in `engine.py` called by `run.py`'s `main()`, which its `if
    __name__ == "__main__":` block calls). A function that nothing calls is left alone, unless it has a rank
    test of its own that picks one process (`if rank == 0: model.save_modules(...)` beside an unguarded
    `torch.save`): code written to run on every rank, which the project calls through a registry or from
    outside the tree. Names a module takes with `from common import *` from a project module are that module's
    imports (`torch.save` is torch's).

    Not findings: a save into memory (`io.BytesIO()`, directly or through a name whose every binding reaching
    the save is one, at the end of a chain across files too), a path that holds a rank of the process
    (directly, or through names of its function whose every binding reaching the save holds one, `final =
    join(out, "state{}.pt".format(gpu))`: one rebound on both sides of an `if` does not reach it, nor the side
    of `if dist.is_initialized():` a distributed run skips; the first parameter of a function passed to
    `mp.spawn` is its process index; a rank a project helper returns, `dp_rank = mpu.dp_rank()`, also as a
    keyword argument of the call that builds the path; the variable of `for i in range(start + rank, end,
    world_size)`, whose indices never meet), a helper that returns early on the other ranks (`if
    dist.get_rank() != 0: return`, also on a parameter every call fills with a rank: `if local_rank is not
    None and local_rank != 0: return` with `local_rank=rank` at each call and none leaving it None), a save
    under a flag that a rank test of its function sets (`if group.rank() == 0: ...; save = True`, then `if
    save: torch.save(...)`), the `if __name__ == "__main__":` block of a module that a DDP program imports but
    that shows no marker itself (a data module run by hand as a script), a file whose processes are another
    framework's (a JAX/Flax or TensorFlow program on several hosts: `jax.process_index()`, `pmap`,
    `flax.jax_utils`, `tf.distribute`, with no marker of torch's own — `torch.distributed`, DDP, a `Trainer`;
    its flags from transformers' `TrainingArguments` and its input from torch's `DataLoader` do not make one).
    A test or a rank chosen by a condition that is no rank test (`get_pg_rank(pp) == 0 if pp is not None else
    mpu.is_pipeline_first_stage()`, `dp_rank = get_pg_rank(dp) if dp is not None else
    mpu.get_data_parallel_rank()`) lets through the ranks of either branch and holds the rank both hold. A
    test the checker reads as a rank test is modelled by the ranks it selects (its `else` branch runs on the
    other ranks), not guessed at as one it cannot read; the rank tests of a helper in another file are read
    with the whole project known (a save in `ckpt.py` under `if mpu.get_data_parallel_rank() == 0:` is not
    reported at the callers of its function; nor past `if not self.may_save(): return`, a method whose `if not
    super().may_save(): return False` reaches a helper returning `False` under `if ctx(cfg).rank() != 0:` in a
    configuration's test: its distributed side), and a module a package's `__init__` binds to another name
    (`mpu = parallel_state`) is that module for `from package import mpu`, and a function it re-exports over a
    submodule of the same name (`from .launch import launch`) is that function.

    ## Why is this bad?
    Every rank runs the same line, so N processes write the same file at once. The result is a corrupt or
    truncated checkpoint (a reader may even load a half-written file), and on shared file systems a run
    that fails only at scale. Saving from one rank is enough: under DDP the replicas are identical.

    ## Known problems
    A path derived from a path by a string method (`last.replace("last", "prev")`, `with_suffix`) is taken
    as shared; an `open(path, "w")` of a fixed configuration name outside a checkpoint folder (a run
    directory's `config.json`) is not a write here. `rank % (world / per_node) == 0` with `per_node`
    defaulting to the world size is read as true on every rank (`rank % 1`), without the hedge "if the
    setting is unset".
    Whether the path is shared is read from its shape (a string, an f-string, `os.path.join`, a name
    like `path`, `ckpt`, `out`, or a name bound to one of those where the save reads it), not its value;
    a path that holds the rank through an attribute, a container or a call of another function is taken
    as shared, and a path holding only a local rank (one file per GPU) is taken as one per process, which
    several machines sharing one directory are not; nor is one that holds only a rank within a group (the
    tensor-parallel rank, `mp_rank_{tp:02d}`), which the replicas of the other groups share: a save to it
    outside any rank test is not reported.
    Objects from a registry (`Registry.get(kind)(cfg)`) and calls through `getattr` are unknown, never
    evidence; a factory that may make one of several classes is taken to make the first that has the
    method called; a parameter's class is known only where its callers pass an object built by the
    constructor. A test the checker cannot read as a rank test but that compares a name or attribute with 0
    or -1 (`if self.device_id <= 0:`) may be one: a save under it, after it where it lets ranks leave (`if
    rank != 0: return`), or reached through a call there, is not reported (also `if step == 0:`), except
    for a parameter every call of the project (one at least) fills with no rank (`save_model(path, epoch
    + 1)`). A nested function passed to a helper gets that helper's arguments, which are not followed: its
    parameters compared with 0 stay maybe rank tests. Where a nested function passed as a callable runs is
    followed into project functions only: one handed to a library, a parameter, a container or returned by
    a factory is taken to run nowhere (its save is not reported, and its rank tests guard nothing else).
    A function with a rank test of its own is taken to run on every rank even if, through a caller the
    checker does not see, only one rank runs it. A module is considered only when it is, or is linked by
    imports to, a module that wraps a model in DDP
    or launches a DeepSpeed / Hugging Face program: a trainer whose group is made by a bare
    `init_process_group` in an unrelated helper module is not checked. A save in a helper module that a
    script calls on every rank is reported twice: at the script's call (with the chain) and at the save.
    A script whose block reaches the module that makes the group only through code the checker does not
    follow (a registry, `getattr`), or whose group is made by a module that only wraps models in DDP, is
    taken as one process: its saves, and those of the helpers only it calls, are not reported.
    A decorator that runs a function on one rank is known by its name (`rank_zero_only`, accelerate's
    `on_main_process` family, mmengine's `master_only`, the LAVIS/BLIP family's `main_process`) or, for a
    project decorator of any name in any file, by its body: a wrapper that calls the decorated function only
    under a rank test (`if int(os.environ["RANK"]) == 0: return fn(*args, **kwargs)`, or after `if not
    is_main(): return`) makes its saves one writer's. A wrapper that tests a keyword of the call (`if
    kwargs.get("leader", True):`) is bound to each call: `leader=` by name decides, by position or left
    out the default does (`True`: every rank, reported at the call too). A function issuing a collective
    outside any rank test runs on every rank though no call names it (`get_class(cfg._target_)(cfg)`). A
    decorator the call passes through (`save = on_main(save)`) or one made by a call (`@only(rank=0)`) is
    not read.
    A call from a file that Lightning or accelerate drive is no evidence that a helper runs on every rank.
    An accelerate module that uses none of the multi-process API (a trainer whose `Accelerator` lives in
    another file) is not checked.
    In a Lightning program, the hooks of a `LightningModule`, `Callback` or `LightningDataModule` subclass
    (`on_*`, the `*_step` methods, `setup`, `teardown`; not `prepare_data`, which runs once per node) are
    taken as run on every process when the file, or a module that imports it, builds a `Trainer` that starts
    several (Lightning's loops call them in each process): a save in `on_validation_end` without
    `self.trainer.is_global_zero` or `@rank_zero_only` is reported, through project helpers too. A save into
    a file object is judged by the path the enclosing `with open(path, "wb") as f:` (or `PathManager.open`)
    opened. Otherwise only the Lightning script's own code is checked, and a `Trainer` left on its defaults
    (`devices="auto"`, which uses every GPU of the machine) or on `ddp_spawn` is not taken as running the
    script on every rank.
    A multi-node launch is read only from a Python file of the project that names the script by its file
    name (not a shell script, a scheduler's configuration or `--nnodes` given on the command line), and is
    taken to share the run directory between the machines.
    A file opened in append or binary mode (a log, `open(p, "wb")` for `torch.save(x, f)`, judged by the
    save), or under another name (`.txt`, `.log`, `.csv`), is not a write here; nor is `Path.write_text`,
    nor a configuration written elsewhere (a settings dump in the working or log directory, which every
    rank may well rewrite with the same text: a race too, not reported).
    A rank test on an attribute the checker cannot read as one (`if args.is_main_process:`) in the calling
    script is taken as no test: a helper of a `src/` package that such a script calls only there is
    reported.

    ## Example
    ```python
    for epoch in range(epochs):
        train(...)
        torch.save(model.state_dict(), "checkpoint.pt")
    ```

    ## Use instead
    ```python
    for epoch in range(epochs):
        train(...)
        if dist.get_rank() == 0:
            torch.save(model.state_dict(), "checkpoint.pt")
        dist.barrier()  # others wait before anyone reads it
    ```
    Lightning's `trainer.save_checkpoint` and accelerate's `accelerator.save` already write from one rank
    and are not reported.

    ## Fix safety
    No automatic fix: the guard should also cover the code that prepares what is saved.

    ## References
    - <https://pytorch.org/tutorials/intermediate/ddp_tutorial.html>
    - <https://pytorch.org/docs/stable/distributed.checkpoint.html>
    """

    code = "DDP601"
    name = "checkpoint-race"
    class_slug = "checkpoint-race"
    severity = Severity.ERROR
    summary = (
        "several processes saving to the same path (`torch.save` without a one-writer rank guard in DDP code)"
    )
    triggers = WRITE_WORDS
    project_wide = True

    @classmethod
    def wanted_in_project(cls, text: str) -> bool:
        """With other files known, any call of a DDP (or Fabric) script may reach a save in another file."""
        return cls.wanted(text) or any(word in text for word in LAUNCH_WORDS)

    def check(self, source: SourceFile) -> Iterator[Finding]:
        hand_written = source.manual_ddp or _in_ddp_program(source)
        lightning = not hand_written and _lightning_processes(source)
        if not (hand_written or lightning or accelerate_trains(source)) or (
                "torch" not in source.text and source.project is None):
            return
        # what writes a file on every process that runs it, and where (writes.checkpoint_write)
        writes = {id(c): written for c in source.calls
                  if (written := checkpoint_write(source, c)) is not None}
        project = source.project
        if not writes and project is None:
            return
        flow = RankFlow(source, lambda branch, cls: False, skip_unranked=False)
        own_script = frozenset() if lightning else own_script_block(source)
        # what that block calls runs when the file is a script of its own: not an entry point of the program
        every_rank = EveryRank(source, flow.calls, lightning_hooks=lightning, not_run=own_script)
        resolver = project.resolver(source) if project is not None else None
        # a script the project starts on several machines: one process per node is several writers
        nodes = launched_on_nodes(project, source.path) if project is not None else None
        seen: set[int] = set()
        for guarded in flow.calls:
            call = guarded.call
            guard = guarded.guard
            per_node = nodes is not None and guard is not None and guard.ranks.kind == Ranks.ONE_PER_NODE
            if (
                guard is not None
                and guard.one_writer_per_node and not per_node
                or not every_rank(guarded.function)
                or id(call) in own_script
            ):
                continue
            if id(call) in writes:
                writer, path = writes[id(call)]
                path = destination(source, call, path) if path is not None else None
                if path is None or not shared_destination(source, path) or holds_rank(source, path) or (
                        guard is None and id(call) in every_rank.maybe_guarded):
                    continue
                what, raced = f"`{writer}` to `{source.segment(path)}`", race(writer)
                consequence, own_fix = raced.consequence, raced.fix
                message = f"{_writers(guard, nodes)} this {what}: {consequence}"
                if guard is None and guarded.function in every_rank.by_own_test:
                    # no caller in the run: the function's own rank test is the evidence
                    message = (f"`{guarded.function.name}()` tests the rank itself (line "
                               f"{every_rank.by_own_test[guarded.function]}), so every rank runs it, but its "
                               f"{what} has no rank test: {consequence}")
                yield self.finding(
                    source,
                    call,
                    message,
                    fix=Fix(message=own_fix or _one_writer(
                        lightning, pretrained=writer.endswith("save_pretrained"))),
                )
                gates = every_rank.keyword_gates
                for site_call, how in gate_misses(gates, guarded.function, every_rank.sites):
                    if id(site_call) not in seen:  # the call decides, not the body (keyword_gates.py)
                        seen.add(id(site_call))
                        yield self.finding(source, site_call, f"{how}: its {what} runs on every rank: "
                                           f"{consequence}",
                                           fix=Fix(message="pass the keyword by name"))
                continue
            if resolver is None or project is None:
                continue
            found = resolver.callee(call.func, guarded.cls.name if guarded.cls else None)
            callee = found[0] if found is not None else _parameter_method(project, every_rank, guarded)
            defined = project.function(callee) if callee is not None else None
            if callee is None or defined is None or defined[0].path == source.path and not per_node:
                continue  # a helper of this file is reported at its own `torch.save`
            chain = project.saves(callee)
            if chain is None or guard is None and id(call) in every_rank.maybe_guarded or not shared_save(
                    project, chain[-1]):
                continue  # (the save read again with the whole project: its file's first pass saw less)
            raced = race(chain[-1].writer)  # (the save step's writer: a folder made, a file written)
            yield self.finding(
                source, call,
                f"{_writers(guard, nodes)} this call, which {raced.act} a path shared by all ranks: "
                f"{show_chain((project.where(callee), *chain))}; {raced.consequence}",
                fix=Fix(message=raced.fix or _one_writer(lightning, pretrained=False, what="call it")),
                facts={"via": " → ".join(step.show() for step in chain)},
            )


# Modules that Lightning or accelerate drive (source.wiring_framework) are judged by their own gates
# (lightning_runs_every_rank, accelerate_trains), not as part of a hand-written program.


def _lightning_processes(source: SourceFile) -> bool:
    """Lightning runs this file's code once per process: its own `Trainer` does, or the `Trainer` of a module
    that imports it (a LightningModule's file, imported by the script that fits it)."""
    if lightning_runs_every_rank(source):
        return True
    project = source.project
    if project is None or source.path not in project.modules:
        return False
    return any(project.modules[p].lightning_processes for p in project.importers(source.path)
               if p in project.modules)


def _in_ddp_program(source: SourceFile) -> bool:
    """A module of a hand-written distributed program (its DDP wrap or launch marker in another file), not
    one that Lightning or accelerate drive."""
    project = source.project
    if project is None or source.path not in project.modules or any(
            wiring_framework(q) for q in source.imports.names.values()) or other_framework_program(source):
        return False
    own = project.modules[source.path]
    return source.trains_with_ddp or own.launched or any(project.modules[p].launched for p in (
        *project.importers(source.path), *own.imports) if p in project.modules)


def _parameter_method(project: ProjectIndex, every_rank: EveryRank, guarded: GuardedCall) -> Target | None:
    """`handler.save(...)` on a parameter whose callers pass objects of one project class."""
    func, method = guarded.function, guarded.call.func
    if func is None or not isinstance(method, ast.Attribute) or not isinstance(method.value, ast.Name):
        return None
    params = [a.arg for a in (*func.args.posonlyargs, *func.args.args, *func.args.kwonlyargs)]
    if method.value.id not in params:
        return None
    return project.parameter_method(every_rank.target(func), params.index(method.value.id), method.attr)


def _one_writer(lightning: bool, *, pretrained: bool, what: str = "save") -> str:
    """The fix in the program's own terms: a Lightning program's rank test and barrier are the trainer's
    (and `trainer.save_checkpoint` is already written once); `save_pretrained` takes the writer as an
    argument."""
    if pretrained:
        return ("pass `is_main_process=` (`dist.get_rank() == 0`; accelerate: `accelerator.is_main_process`) "
                "so that one process writes")
    if lightning:
        return (f"{what} on global rank 0 only (`if self.trainer.is_global_zero:`), then "
                "`self.trainer.strategy.barrier()` before any rank reads it; or "
                "`trainer.save_checkpoint(path)` on every rank, which Lightning writes once")
    return (f"{what} on one rank only (`if dist.get_rank() == 0:`), then `dist.barrier()` before any rank "
            "reads it")


def _writers(guard: Guard | None, nodes: tuple[str, int] | None = None) -> str:
    if guard is None:
        return "every rank runs"
    where = f"`{guard.description}` (line {guard.line})"
    if nodes is not None and guard.ranks.kind == Ranks.ONE_PER_NODE:
        return (f"{where} lets one process per node through, and `{nodes[0]}` (line {nodes[1]}) starts this "
                "script on several machines (`--nnodes`): on a file system they share, one process of each "
                "node runs")
    if guard.early_exit:
        return f"the ranks that go on after {where} run"
    if guard.ranks.kind == Ranks.NODE:
        return f"{where} tests a node rank, the same on every process of that node: all of them run"
    return f"{where} lets {guard.ranks.kind.value} through to"

