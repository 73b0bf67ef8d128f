"""F2 init-module-scope: a loader whose sampler or generator lives on a non-CPU device."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from ddpdoctor.findings import Finding, Fix, Severity

# --------------------------------------------------------------------------------------------- loaders


def iter_loaders(obj: Any, name: str = "dataloader") -> Iterator[tuple[str, Any]]:
    """(name, loader) for a loader, a Lightning CombinedLoader, or a list/tuple/dict of them."""
    if obj is None:
        return
    if isinstance(obj, dict):
        for key, value in obj.items():
            yield from iter_loaders(value, f"{name}[{key!r}]")
    elif isinstance(obj, (list, tuple)):
        for index, value in enumerate(obj):
            yield from iter_loaders(value, f"{name}[{index}]")
    elif hasattr(obj, "flattened") and not hasattr(obj, "sampler"):
        yield from iter_loaders(obj.flattened, name)
    else:
        yield name, obj


def _generators(loader: Any) -> Iterator[tuple[str, Any]]:
    """Each distinct generator of a loader, named by where it sits (`shuffle=True` shares the loader's
    generator with its RandomSampler: reported once, as `generator`)."""
    sampler = getattr(loader, "sampler", None)
    inner = getattr(getattr(loader, "batch_sampler", None), "sampler", None)
    candidates = [
        ("generator", getattr(loader, "generator", None)),
        ("sampler.generator", getattr(sampler, "generator", None)),
        ("batch_sampler.sampler.generator", getattr(inner, "generator", None)),
    ]
    seen: set[int] = set()
    for where, generator in candidates:
        if generator is not None and id(generator) not in seen:
            seen.add(id(generator))
            yield where, generator


def audit_loader_generators(loader: Any, name: str = "dataloader") -> list[Finding]:
    """Generators of a loader, its sampler or its batch sampler's sampler that are not on the CPU (F2)."""
    findings = []
    for where, generator in _generators(loader):
        device = getattr(generator, "device", None)
        if not isinstance(device, torch.device) or device.type == "cpu":
            continue
        findings.append(
            Finding(
                class_="init-module-scope",
                message=(
                    f"the {name}'s `{where}` is a generator on {device}: samplers draw their permutations on "
                    f"the CPU and fail with `Expected a '{device.type}' device type for generator but found "
                    "'cpu'` (or the reverse) when the loader is first iterated"
                ),
                severity=Severity.ERROR,
                fix=Fix(
                    "Pass a CPU generator (`torch.Generator().manual_seed(seed)`), and create it outside "
                    "`init_module()` / `torch.device(...)` blocks."
                ),
                facts={"loader": name, "attribute": where, "device": str(device)},
            )
        )
    return findings


