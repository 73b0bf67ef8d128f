"""The data loaders of a file that draw from a shuffling `DistributedSampler`, followed where they are kept
and where they go: by access path (`loader`, `loaders['train']`, `self.train_loader`), out of builders in any
module, into helpers and methods that loop over them, into project classes whose epoch loop walks them, and in
through the parameters that callers fill with what a builder returned. DDP501 asks it whether an epoch loop
draws batches from such a loader, and gets the chain that shows it."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from .flows import ANY_KEY, iterated, path_of, same_place, suffix_after
from .project import (
    ProjectIndex,
    Resolver,
    Step,
    Target,
    bound_paths,
    held_loaders,
    sampler_entries,
    show_chain,
    shuffling_sampler,
)
from .samplers import sampler_shuffles
from .source import SourceFile, call_name, dotted, keyword, statements


def spans(source: SourceFile, starts: set[int]) -> list[tuple[int, int]]:
    return [(node.lineno, node.end_lineno or node.lineno) for node in statements(source.tree.body)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.lineno in starts]


class EpochLoaders:
    """The loaders of a file that draw from a shuffling DistributedSampler, by access path (`loader`,
    `loaders['train']`, `self.train_loader`), with what made them, and the ways the index follows them."""

    def __init__(self, source: SourceFile):
        self.source = source
        project = source.project
        self.project = project
        self.resolver: Resolver | None = project.resolver(source) if project is not None else None
        self.program_set_epoch = project is not None and any(
            m.set_epoch for m in project.component(source.path)
        )
        self.paths: dict[str, int] = {}
        self.built: dict[str, tuple[Step, ...]] = {}
        self.sampler_nodes: dict[str, ast.AST] = {}
        self.objects: dict[str, tuple[Target, ast.Call]] = {}  # `trainer = Trainer(...)`: a project class
        samplers: dict[str, ast.AST] = {}
        assigns = [s for s in statements(source.tree.body) if isinstance(s, ast.Assign)]
        for stmt in assigns:
            if shuffling_sampler(stmt.value, source):
                samplers.update((p, stmt.value) for t in stmt.targets if (p := path_of(t)))
        for stmt in assigns:  # `loader_args = {"sampler": sampler}`, then `DataLoader(ds, **loader_args)`
            samplers.update((p, stmt.value) for p in sampler_entries(stmt, set(samplers), source))
        for stmt in assigns:
            held = held_loaders(stmt.value, set(samplers), set(self.paths), source=source)
            if held:
                for target in stmt.targets:
                    for path in bound_paths(target, held):
                        self.paths.setdefault(path, stmt.lineno)
                        self._remember_sampler(path, stmt.value, held, samplers)
                continue
            if self.resolver is None or not isinstance(stmt.value, ast.Call):
                continue
            kind = self.resolver.class_of(stmt.value) if call_name(stmt.value)[:1].isupper() else None
            if kind is not None and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
                self.objects[stmt.targets[0].id] = (kind, stmt.value)
            elif project is not None and not self.program_set_epoch and (
                    builder := self.resolver.callee(stmt.value.func, None)):
                made = project.returns_loader(builder[0])  # `loader = build_loader(...)`, in any module
                if made is not None:
                    chain, suffixes = made
                    for target in stmt.targets:
                        for path in bound_paths(target, suffixes):
                            self.paths.setdefault(path, stmt.lineno)
                            self.built[path] = chain
        self._drawn_from_containers()
        if project is not None and not self.program_set_epoch:
            self._kept_elsewhere(project)
            self._passed_in(project)

    def _drawn_from_containers(self) -> None:
        """`for name, loader in loaders.items():` and `for loader in loaders.values():` bind each loader
        a dict of loaders holds (a loop variable is one more path to it)."""
        for loop in statements(self.source.tree.body):
            if not isinstance(loop, (ast.For, ast.AsyncFor)) or not isinstance(loop.iter, ast.Call):
                continue
            func = loop.iter.func
            if not isinstance(func, ast.Attribute) or func.attr not in ("items", "values") or loop.iter.args:
                continue
            held = path_of(func.value, any_key=True)
            if held is None or not any(suffix_after(path, held + ANY_KEY) == "" for path in self.paths):
                continue
            target = loop.target
            if func.attr == "items" and isinstance(target, ast.Tuple) and len(target.elts) == 2:
                target = target.elts[1]
            bound = path_of(target)
            if bound is not None and bound not in self.paths:
                self.paths[bound] = loop.lineno
                container = next(path for path in self.paths if suffix_after(path, held + ANY_KEY) == "")
                if container in self.built:
                    self.built[bound] = self.built[container]
                if container in self.sampler_nodes:
                    self.sampler_nodes[bound] = self.sampler_nodes[container]

    def _passed_in(self, project: ProjectIndex) -> None:
        """`def fit(model, train_loader)` where a caller, in any file, passes what a loader builder returned
        (`train_loader, val_loader = build(cfg)`, then `fit(model, train_loader)`)."""
        for node in statements(self.source.tree.body):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            cls = next((c.name for c in self.source.classes.values() if node in c.body), None)
            target = Target(self.source.path, f"{cls}.{node.name}" if cls else node.name)
            params = [a.arg for a in (*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs)]
            found = project.function(target) if node.name == "__init__" and cls else None
            kept = found[1].keeps if found is not None else ()
            for index, rest, chain in project.loader_parameters(target):
                if index < len(params) and (path := params[index] + rest) not in self.paths:
                    self.paths[path] = node.lineno
                    self.built[path] = chain
                # `self.loader = loader` in the constructor: the class's methods walk it on `self`
                for attr, param in kept:
                    if param == index and (path := f"self.{attr}{rest}") not in self.paths:
                        self.paths[path] = node.lineno
                        self.built[path] = chain

    def _kept_elsewhere(self, project: ProjectIndex) -> None:
        """`for batch in data.train_loader` where a file of the program keeps such a loader on an attribute
        of that name (`self.train_loader = DataLoader(..., sampler=DistributedSampler(...))`): attributes
        are joined over every assignment in the program, whatever object holds them."""
        kept = {attr: (module.path, line) for module in project.component(self.source.path)
                for attr, line in module.loader_attributes}
        if not kept:
            return
        for loop in statements(self.source.tree.body):
            if not isinstance(loop, (ast.For, ast.AsyncFor)):
                continue
            for node in (loop.iter, *(loop.iter.args[:2] if isinstance(loop.iter, ast.Call) else ())):
                if isinstance(node, ast.Attribute) and node.attr in kept and (path := path_of(node)):
                    where, line = kept[node.attr]
                    if path not in self.paths:
                        self.paths[path] = loop.lineno
                        self.built[path] = (Step(f"`.{node.attr} = DataLoader(…)`", where, line),)

    def _remember_sampler(
        self, path: str, value: ast.expr, held: list[str], samplers: dict[str, ast.AST]
    ) -> None:
        """The sampler of a loader made here (`DataLoader(..., sampler=s)`), for findings about it."""
        for node in ast.walk(value) if not isinstance(value, ast.Call) or held != [""] else (value,):
            if isinstance(node, ast.Call) and call_name(node).endswith("DataLoader"):
                given = keyword(node, "sampler")
                if given is None:
                    continue
                if isinstance(given.value, ast.Call):
                    self.sampler_nodes.setdefault(path, given.value)
                elif (name := path_of(given.value)) in samplers:
                    self.sampler_nodes.setdefault(path, samplers[name])
                return

    def describe(self, path: str) -> str:
        origin = f", built by {show_chain(self.built[path])}" if path in self.built else ""
        sampler = self.sampler_nodes.get(path)
        if isinstance(sampler, ast.Call) and (answer := sampler_shuffles(sampler, self.source)).hedge:
            origin += f"; its sampler shuffles {answer.hedge}"
        return f"`{path}` (line {self.paths[path]}{origin})"

    def _arguments(self, call: ast.Call) -> Iterator[tuple[int | str, str, str]]:
        """(argument, loader path, where the loader is in the argument) for each argument holding a loader."""
        arguments: list[tuple[int | str, ast.expr]] = [*enumerate(call.args)]
        arguments += [(kw.arg, kw.value) for kw in call.keywords if kw.arg]
        for where, arg in arguments:
            given = path_of(arg, any_key=True)
            if given is None:
                continue
            for path in self.paths:
                rest = suffix_after(path, given)
                if rest is not None:
                    yield where, path, rest

    def followed(self, call: ast.Call, cls: str | None) -> tuple[str, tuple[Step, ...]] | None:
        """A call in an epoch loop that draws batches from a loader: `train(model, loader)` (any module, any
        depth, a dict of loaders included) or `self.train_epoch()` iterating `self.loader`."""
        if self.resolver is None or self.project is None:
            return None
        found = self.resolver.callee(call.func, cls, {name: made for name, (made, _) in self.objects.items()})
        if found is None:
            return None
        target, bound = found
        for where, path, rest in self._arguments(call):
            steps = self.project.iterates(target, where, bound, rest)
            if steps is not None:
                return path, steps
        receiver = call.func.value if isinstance(call.func, ast.Attribute) else None
        if bound and isinstance(receiver, ast.Name) and receiver.id in self.objects:
            made, construction = self.objects[receiver.id]
            for where, path, rest in self._arguments(construction):
                steps = self.project.object_iterates(target, where, rest)
                if steps is not None:
                    return path, (
                        Step(f"`{call_name(construction)}(…)`", self.source.path, construction.lineno),
                        *steps,
                    )
        if bound and isinstance(receiver, ast.Name) and receiver.id == "self":
            for path in self.paths:
                if path.startswith("self."):
                    steps = self.project.self_iterates(target, path[5:])
                    if steps is not None:
                        return path, (self.project.where(target), *steps)
        return None

    def constructed(self, call: ast.Call) -> tuple[str, tuple[Step, ...]] | None:
        """`Trainer(model, loaders)`: a project class given a loader, whose epoch loop walks it."""
        if self.resolver is None or self.project is None or not call_name(call)[:1].isupper():
            return None
        made = self.resolver.class_of(call)
        if made is None:
            return None
        for where, path, rest in self._arguments(call):
            steps = self.project.epoch_loop(made, where, rest)
            if steps is not None:
                here = Step(f"`{call_name(call)}(…)`", self.source.path, call.lineno)
                return path, (here, *steps)
        return None


def iterated_loader(node: ast.expr, loaders: dict[str, int]) -> str | None:
    """`loader`, `loaders['train']`, `loaders[phase]` (any key of a dict of loaders), `enumerate(loader)`,
    `tqdm(loader, ...)`, `zip(loader, ...)`."""
    name = path_of(node, any_key=True)
    if name in loaders:
        return name
    if name is not None and (ANY_KEY in name or any(ANY_KEY in path for path in loaders)):
        found = next((path for path in loaders if same_place(path, name)), None)
        if found is not None:
            return found
    if isinstance(node, ast.Call):
        for arg in node.args[:2]:
            found = iterated_loader(arg, loaders)
            if found:
                return found
    return None


def picks_loader(outer: ast.For | ast.While, inner: ast.For | ast.AsyncFor) -> bool:
    """`for phase in loaders: for batch in loaders[phase]`: the outer loop chooses which loader of a dict the
    inner one walks (its variable is the key), so it repeats no loader: it is no epoch loop."""
    if not isinstance(outer, ast.For):
        return False
    keys = {node.id for node in ast.walk(outer.target) if isinstance(node, ast.Name)}
    return any(isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Name) and node.slice.id in keys
               for node in ast.walk(inner.iter))


def cycled_parameters(source: SourceFile) -> Iterator[
        tuple[str, str, str, ast.While | ast.For | ast.AsyncFor, ast.AST]]:
    """Parameters annotated as data loaders (`loader: DataLoader`, `StatefulDataLoader`) that a loop of
    their function walks again on every pass: `for b in loader` or `yield from loader` inside it, or
    `iter(loader)` called in it (a new pass once the last one is exhausted). (function, parameter,
    annotation, the repeating loop, the node that starts a pass)."""
    if "Loader" not in source.text:
        return
    for function in statements(source.tree.body):
        if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        arguments = (*function.args.posonlyargs, *function.args.args, *function.args.kwonlyargs)
        typed = {a.arg: kind for a in arguments if a.annotation is not None
                 and (kind := _last_word(a.annotation)).endswith("DataLoader")}
        if not typed:
            continue
        for outer in statements(function.body):
            if not isinstance(outer, (ast.While, ast.For, ast.AsyncFor)):
                continue
            again = _new_pass(outer, set(typed))
            if again is not None:
                node, name = again
                yield function.name, name, typed[name], outer, node
                break


def _new_pass(loop: ast.While | ast.For | ast.AsyncFor, names: set[str]) -> tuple[ast.AST, str] | None:
    """The first place in the loop's body that starts a new pass over one of `names`."""
    for stmt in loop.body:
        for node in ast.walk(stmt):
            walked: ast.expr | None = None
            if isinstance(node, (ast.For, ast.AsyncFor)):
                walked = iterated(node.iter)
            elif isinstance(node, ast.YieldFrom):
                walked = node.value
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and (
                    node.func.id == "iter" and len(node.args) == 1):
                walked = node.args[0]
            if isinstance(walked, ast.Name) and walked.id in names:
                return node, walked.id
    return None


def _last_word(annotation: ast.expr) -> str:
    """`DataLoader`, `torch.utils.data.DataLoader`, `"DataLoader"`, `Optional[DataLoader]`: the class."""
    if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
        return annotation.value.rsplit(".", 1)[-1].strip()
    if isinstance(annotation, ast.Subscript):
        return _last_word(annotation.slice)
    if isinstance(annotation, ast.BinOp):  # `DataLoader | None`
        return _last_word(annotation.left)
    return (dotted(annotation) or "").rsplit(".", 1)[-1]
