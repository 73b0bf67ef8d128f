"""One parsed source file as the rules see it: text, tree, import table and a few cheap indexes.

Everything here is computed lazily, once per file: a rule that the pre-filter skips costs nothing.
"""

from __future__ import annotations

import ast
import re
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .project import ProjectIndex

# Old and new package names of the same libraries: resolve both to one spelling.
_PACKAGE_ALIASES = (
    ("pytorch_lightning", "lightning.pytorch"),
    ("lightning_fabric", "lightning.fabric"),
)


_DDP_EVIDENCE = re.compile(
    r"""strategy\s*=\s*["'](?:ddp|deepspeed|fsdp)|DDPStrategy|DistributedDataParallel|init_process_group"""
)


# `ddp_model.module.state_dict()`: reaching through a DDP wrapper.
_DDP_MODULE = re.compile(r"\bddp\w*\.module\b", re.IGNORECASE)


def canonical(qualname: str) -> str:
    for old, new in _PACKAGE_ALIASES:
        if qualname == old or qualname.startswith(old + "."):
            return new + qualname[len(old):]
    return qualname


def dotted(node: ast.expr) -> str | None:
    """`self.trainer.strategy.barrier` for that attribute chain, without resolving imports."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    if isinstance(node, ast.Call):  # `self.trainer.strategy` is fine; `get_x().y` keeps the tail only
        parts.append("()")
        return ".".join(reversed(parts))
    return None


@dataclass
class ImportTable:
    """Local name -> fully qualified name, from every import statement in the file (any scope)."""

    names: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_tree(cls, tree: ast.Module, found: list[ast.stmt] | None = None) -> ImportTable:
        """`found`: the tree's statements when the caller has walked them already (`all_statements`)."""
        table = cls()
        for node in found if found is not None else statements(tree.body):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.asname:
                        table.names[alias.asname] = canonical(alias.name)
                    else:
                        top = alias.name.split(".")[0]
                        table.names[top] = canonical(top)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                module = canonical(node.module)
                for alias in node.names:
                    if alias.name != "*":
                        table.names[alias.asname or alias.name] = f"{module}.{alias.name}"
        return table

    def resolve(self, node: ast.expr) -> str | None:
        """The qualified name an expression refers to (`dist.all_reduce` ->
        `torch.distributed.all_reduce`)."""
        parts: list[str] = []
        while isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        if not isinstance(node, ast.Name):
            return None
        base = self.names.get(node.id)
        if base is None:
            return None
        parts.append(base)
        return canonical(".".join(reversed(parts)))


# Frameworks that wire the processes themselves (a `Trainer`, an `Accelerator`), and the parts of them that
# are utilities only (`from accelerate.utils import is_xpu_available` in a torchrun FSDP script wires none).
WIRING_FRAMEWORKS = ("lightning", "pytorch_lightning", "accelerate")
UTILITY_MODULES = ("accelerate.utils.", "lightning.fabric.utilities.", "lightning.pytorch.utilities.",
                   "pytorch_lightning.utilities.", "lightning_utilities.")


def wiring_framework(qualname: str) -> bool:
    """An import of a framework that runs the processes' wiring (not one of its utility modules)."""
    return qualname.startswith(WIRING_FRAMEWORKS) and not qualname.startswith(UTILITY_MODULES)


def is_lightning(qualname: str | None, name: str) -> bool:
    """`qualname` is Lightning's `name` class, under any of its import paths."""
    return bool(qualname) and qualname.startswith("lightning") and qualname.rsplit(".", 1)[-1] == name  # type: ignore[union-attr]


@dataclass
class SourceFile:
    path: str
    text: str
    tree: ast.Module
    # The other files of the run, summarised (None when a file is checked alone): rules that follow calls
    # into other functions and modules ask it.
    project: ProjectIndex | None = None

    @cached_property
    def lines(self) -> list[str]:
        return self.text.splitlines(keepends=True)

    @cached_property
    def imports(self) -> ImportTable:
        table = ImportTable.from_tree(self.tree, self.all_statements)
        if self.project is not None and "import *" in self.text:
            # `from header import *` where the project's `header` imports torch: its names are this file's
            for name, qualified in self.project.files.star_names(self.path, self.tree).items():
                table.names.setdefault(name, qualified)
        return table

    @cached_property
    def all_statements(self) -> list[ast.stmt]:
        """Every statement at any depth, in `statements`' order: one walk shared by the import table, the
        class table and the project index (each walked the file's statements again)."""
        return list(statements(self.tree.body))

    @cached_property
    def classes(self) -> dict[str, ast.ClassDef]:
        return {n.name: n for n in self.all_statements if isinstance(n, ast.ClassDef)}

    @cached_property
    def module_functions(self) -> dict[str, ast.FunctionDef | ast.AsyncFunctionDef]:
        """The module-level functions by name (the last definition wins, as when the module runs); made
        once per file, not once per decorated function or spawn call that asks."""
        return {n.name: n for n in self.tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}

    def resolve(self, node: ast.expr) -> str | None:
        return self.imports.resolve(node)

    @cached_property
    def calls(self) -> list[ast.Call]:
        """Every call in the file, from one walk shared by the rules that need it."""
        found: list[ast.Call] = []
        stack: list[ast.AST] = [self.tree]
        call_type, list_type = ast.Call, list
        children, sparse = _CHILD_FIELDS, _SPARSE_LISTS
        while stack:
            node = stack.pop()
            cls = node.__class__
            if cls is call_type:
                found.append(node)  # type: ignore[arg-type]
            fields = children.get(cls)
            if fields is None:
                fields = children[cls] = _child_fields(cls)
            for name in fields:
                value = getattr(node, name, None)
                if value.__class__ is list_type:
                    stack.extend(value if cls not in sparse else [v for v in value if v is not None])
                elif value is not None:
                    stack.append(value)
        found.sort(key=lambda c: (c.lineno, c.col_offset))
        return found

    def subclasses_of(self, predicate_name: str) -> set[str]:
        """Names of classes in this file that derive (directly or through classes of this file) from the
        Lightning class `predicate_name` (`LightningModule`, `LightningDataModule`, `Callback`)."""
        return self._subclasses(lambda base: is_lightning(self.resolve(base), predicate_name))

    def _subclasses(self, is_root) -> set[str]:
        found: set[str] = set()
        changed = True
        while changed:
            changed = False
            for name, cls in self.classes.items():
                if name in found:
                    continue
                for base in cls.bases:
                    if is_root(base) or isinstance(base, ast.Name) and base.id in found:
                        found.add(name)
                        changed = True
                        break
        return found

    @cached_property
    def lightning_modules(self) -> set[str]:
        return self.subclasses_of("LightningModule")

    @cached_property
    def trains_with_ddp(self) -> bool:
        """The file sets up DDP training itself: a Lightning `ddp*` strategy, `DDPStrategy`, `torch`'s
        `DistributedDataParallel` or `init_process_group`. A text test: cheap, and the rules that use it
        only need to know that this file is DDP code."""
        return bool(_DDP_EVIDENCE.search(self.text))

    @cached_property
    def manual_ddp(self) -> bool:
        """Plain `torch.distributed` training (no Lightning, Fabric or accelerate doing the wiring)."""
        if not ("init_process_group" in self.text or "DistributedDataParallel" in self.text
                or ".module" in self.text.lower() and _DDP_MODULE.search(self.text)):  # the regex alone
            # (case-insensitive, no literal to skip to) cost more than the rest of the property
            return False
        return not any(wiring_framework(q) for q in self.imports.names.values())

    def uses(self, package: str) -> bool:
        return any(q == package or q.startswith(package + ".") for q in self.imports.names.values())

    def column(self, line: int, byte_offset: int) -> int:
        """ast columns are UTF-8 byte offsets; findings and edits use 1-based character columns."""
        text = self.lines[line - 1] if 0 < line <= len(self.lines) else ""
        if text.isascii():
            return byte_offset + 1
        return len(text.encode("utf-8")[:byte_offset].decode("utf-8", errors="replace")) + 1

    def span(self, node: ast.AST) -> tuple[int, int, int, int]:
        """(line, column, end_line, end_column), 1-based character columns, end exclusive."""
        line = node.lineno  # type: ignore[attr-defined]
        end_line = node.end_lineno or line  # type: ignore[attr-defined]
        end_col = node.end_col_offset if node.end_col_offset is not None else node.col_offset  # type: ignore[attr-defined]
        return (line, self.column(line, node.col_offset), end_line,  # type: ignore[attr-defined]
                self.column(end_line, end_col))

    def segment(self, node: ast.AST) -> str:
        """The source text of a node (ast.get_source_segment re-splits the whole file on every call)."""
        line, end_line = node.lineno, node.end_lineno or node.lineno  # type: ignore[attr-defined]
        start, end = node.col_offset, node.end_col_offset  # type: ignore[attr-defined]
        chunk = "".join(self.lines[line - 1:end_line]).encode("utf-8")
        last = len("".join(self.lines[line - 1:end_line - 1]).encode("utf-8"))
        return chunk[start:last + (end if end is not None else len(chunk))].decode("utf-8", errors="replace")

    def text_of(self, node: ast.AST) -> str:
        """The whole lines a statement spans (cheap; for substring pre-filters)."""
        return "".join(self.lines[node.lineno - 1:node.end_lineno or node.lineno])  # type: ignore[attr-defined]


# Per node class, the fields that can hold a call: not names, operators, contexts or constants.
_LEAF_FIELDS = frozenset({"ctx", "op", "id", "attr", "name", "arg", "asname", "module", "level", "value_kind",
                          "kind", "conversion", "is_async", "names", "type_comment", "lineno", "col_offset",
                          "end_lineno", "end_col_offset", "ops", "kwd_attrs"})
_CHILD_FIELDS: dict[type, tuple[str, ...]] = {ast.Constant: (), ast.Name: ()}
# The only node classes whose lists of children may hold None (`{**x}`'s key, a keyword-only parameter
# without a default): every other list field of `_CHILD_FIELDS` holds nodes only, and is taken whole
# (filtering each item was most of the cost of a walk).
_SPARSE_LISTS = frozenset({ast.Dict, ast.arguments})


def _child_fields(cls: type) -> tuple[str, ...]:
    return tuple(f for f in getattr(cls, "_fields", ()) if f not in _LEAF_FIELDS)


def child_nodes(node: ast.AST) -> list[ast.AST]:
    """`ast.iter_child_nodes(node)` without the contexts and operators, as a list (cheaper to make)."""
    cls = node.__class__
    fields = _CHILD_FIELDS.get(cls)
    if fields is None:
        fields = _CHILD_FIELDS[cls] = _child_fields(cls)
    found: list[ast.AST] = []
    for name in fields:
        value = getattr(node, name, None)
        if value.__class__ is list:
            found.extend(value if cls not in _SPARSE_LISTS else [v for v in value if v is not None])
        elif isinstance(value, ast.AST):
            found.append(value)
    return found


def walk(root: ast.AST) -> Iterator[ast.AST]:
    """`ast.walk`'s nodes in `ast.walk`'s order (breadth first), without the contexts and operators
    (`Load`, `Add`, `Eq`): a few times faster on a large function, the fields that hold no expression being
    skipped. Ask it for expressions and statements, never for an operator node."""
    todo = deque((root,))
    pop, push, extend = todo.popleft, todo.append, todo.extend
    ast_type, list_type = ast.AST, list
    children, sparse = _CHILD_FIELDS, _SPARSE_LISTS
    while todo:
        node = pop()
        yield node
        cls = node.__class__
        fields = children.get(cls)
        if fields is None:
            fields = children[cls] = _child_fields(cls)
        for name in fields:
            value = getattr(node, name, None)
            if value.__class__ is list_type:
                extend(value if cls not in sparse else [v for v in value if v is not None])
            elif isinstance(value, ast_type):
                push(value)


def statements(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """Every statement, at any depth (functions and classes included), without visiting expressions."""
    stack = list(reversed(body))
    blocks_of = _BLOCKS
    while stack:
        node = stack.pop()
        yield node
        cls = node.__class__
        blocks = blocks_of.get(cls)
        if blocks is None:
            blocks = blocks_of[cls] = tuple(f for f in _BLOCK_FIELDS if f in getattr(cls, "_fields", ()))
        for name in blocks:  # most statements have none: no lookups for them
            block = getattr(node, name)
            if name == "handlers" or name == "cases":
                for part in block:
                    stack.extend(reversed(part.body))
            elif block:
                stack.extend(reversed(block))


# The fields that hold statements, in the order `statements` stacks them (that order is its output's).
_BLOCK_FIELDS = ("body", "orelse", "finalbody", "handlers", "cases")
_BLOCKS: dict[type, tuple[str, ...]] = {}


def functions(tree: ast.AST) -> Iterator[ast.FunctionDef | ast.AsyncFunctionDef]:
    for node in walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node


def keyword(call: ast.Call, name: str) -> ast.keyword | None:
    for kw in call.keywords:
        if kw.arg == name:
            return kw
    return None


def is_true(node: ast.expr | None) -> bool:
    return isinstance(node, ast.Constant) and node.value is True


def last_name(node: ast.expr) -> str:
    """The last name of a name or attribute chain: `DataLoader` for `torch.utils.data.DataLoader`."""
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Name):
        return node.id
    return ""


def call_name(call: ast.Call) -> str:
    """The last name of the callee: `DataLoader` for `torch.utils.data.DataLoader(...)`."""
    return last_name(call.func)
