"""Which versions of a library a project declares: the upper end of its requirement in the nearest file of
requirements above a source file (`requirements*.txt`, `setup.py`, `pyproject.toml`, a conda
`environment*.yml`). A library's behaviour that changed between releases (transformers syncing an FSDP
model's `generate()` by itself) is then known for the releases the project can run with; where the project
declares no ceiling the answer is None, and the rule that asks stays silent or hedges."""

from __future__ import annotations

import functools
import os
import re
from dataclasses import dataclass

MAX_LEVELS = 6  # folders walked up from the source file: a repository's root is rarely deeper
_NAMES = re.compile(
    r"^(requirements[\w.-]*\.txt|setup\.py|setup\.cfg|pyproject\.toml|environment[\w.-]*\.ya?ml)$")
# `pkg==4.29.2`, `pkg<=4.40`, `pkg<4.46`, `pkg~=4.30.1`, conda's `pkg=4.29`; extras and quotes allowed
_REQUIREMENT = r"(?<![\w.-]){name}\s*(?:\[[^\]]*\])?\s*(==|<=|<|~=|=)\s*([0-9]+(?:\.[0-9]+)*)"


@dataclass(frozen=True)
class Ceiling:
    """The highest release of a library a project's requirement allows."""

    version: tuple[int, ...]
    below: bool  # `<X`: X itself is excluded
    where: str  # the file and its requirement, for the message

    def before(self, release: tuple[int, ...]) -> bool:
        """Every allowed release precedes `release`."""
        if self.below:
            return self.version <= release
        return self.version < release


def declared_ceiling(path: str, package: str) -> Ceiling | None:
    """The ceiling of `package` in the nearest folder above `path` whose requirement files name it with
    one (the highest, where several files or lines do)."""
    folder = os.path.dirname(os.path.abspath(path))
    for _ in range(MAX_LEVELS):
        found = _in_folder(folder, package)
        if found is not None:
            return found
        parent = os.path.dirname(folder)
        if parent == folder or os.path.isdir(os.path.join(folder, ".git")):
            return None
        folder = parent
    return None


@functools.lru_cache(maxsize=256)
def _in_folder(folder: str, package: str) -> Ceiling | None:
    try:
        names = sorted(name for name in os.listdir(folder) if _NAMES.match(name))
    except OSError:
        return None
    pattern = re.compile(_REQUIREMENT.format(name=re.escape(package)), re.IGNORECASE)
    best: Ceiling | None = None
    for name in names:
        try:
            with open(os.path.join(folder, name), encoding="utf-8", errors="replace") as handle:
                text = handle.read(200_000)
        except OSError:
            continue
        for match in pattern.finditer(text):
            operator, number = match.group(1), match.group(2)
            version = tuple(int(part) for part in number.split("."))
            if operator == "~=" and len(version) > 1:
                version = (*version[:-2], version[-2], 10**6)  # `~=4.30.1` allows every 4.30.x
            ceiling = Ceiling(version, operator == "<", f"`{match.group(0).strip()}` in {name}")
            if best is None or (ceiling.version, not ceiling.below) > (best.version, not best.below):
                best = ceiling
    return best
