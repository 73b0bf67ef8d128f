"""What an attribute of a settings object holds when nothing overrides it: `args.device_map`,
`model_args.shuffle`, `cfg.save_every`, read where the object's class or parser is not followed.

Three places in a file say it: a class-level field of that name (a dataclass or settings class:
`device_map: str = "auto"`, `device_map: str = field(default="auto")`, the classes Hugging Face's
`HfArgumentParser` fills), an argparse option (`add_argument("--device-map", default="auto")`, its `dest`
when given), and an assignment to the attribute on a name (`args.device_map = "auto"`). The values are the
defaults a run gets unless its command line or config says otherwise: evidence to be hedged, never proof.
"""

from __future__ import annotations

import ast

from .source import SourceFile


def declared_values(source: SourceFile, attribute: str) -> tuple[ast.expr, ...]:
    """Every expression this file declares as `attribute`'s value on a settings object."""
    if attribute not in source.text:
        return ()
    declared = getattr(source, "_declared_values", None)
    if declared is None:
        declared = _declared(source)
        source._declared_values = declared  # type: ignore[attr-defined]
    return declared.get(attribute, ())


def _declared(source: SourceFile) -> dict[str, tuple[ast.expr, ...]]:
    found: dict[str, list[ast.expr]] = {}
    for node in ast.walk(source.tree):
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                name, value = _field(item)
                if name is not None and value is not None:
                    found.setdefault(name, []).append(value)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and (
                node.func.attr == "add_argument"):
            dest, default = _option(node)
            if dest is not None and default is not None:
                found.setdefault(dest, []).append(default)
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and (
                        target.value.id not in ("self", "cls")):
                    found.setdefault(target.attr, []).append(node.value)
    return {name: tuple(values) for name, values in found.items()}


def _field(item: ast.stmt) -> tuple[str | None, ast.expr | None]:
    """`name: T = default`, `name: T = field(default=...)`, `name = default` in a class body."""
    if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
        name, value = item.target.id, item.value
    elif isinstance(item, ast.Assign) and len(item.targets) == 1 and isinstance(item.targets[0], ast.Name):
        name, value = item.targets[0].id, item.value
    else:
        return None, None
    if isinstance(value, ast.Call) and (getattr(value.func, "id", None) == "field"
                                        or getattr(value.func, "attr", None) == "field"):
        value = next((kw.value for kw in value.keywords if kw.arg == "default"), None)
    return name, value


def _option(call: ast.Call) -> tuple[str | None, ast.expr | None]:
    """The attribute an argparse option fills (`dest=`, else its first long flag) and its default."""
    keywords = {kw.arg: kw.value for kw in call.keywords if kw.arg}
    default = keywords.get("default")
    dest = keywords.get("dest")
    if isinstance(dest, ast.Constant) and isinstance(dest.value, str):
        return dest.value, default
    flags = [a.value for a in call.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
    long = next((f for f in flags if f.startswith("--")), flags[0] if flags else None)
    if long is None:
        return None, default
    return long.lstrip("-").replace("-", "_"), default
