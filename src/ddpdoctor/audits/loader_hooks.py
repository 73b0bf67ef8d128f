"""The loader audits the guard runs in every rank with no code change: F7 (a shuffling DistributedSampler
iterated again at the same epoch; a shuffling loader that does not shard) and F2 (a loader's generator on a
device its sampler cannot draw on).

Three entry points are patched, each run once per epoch or once per sampler, never per batch:

- `DistributedSampler.__init__` (subclasses that call it included: Lightning's `DistributedSamplerWrapper`):
  the user's line that built the sampler;
- `DistributedSampler.set_epoch`: how many times the program called it (a pass at an unchanged epoch right
  after a `set_epoch` call is a peek or an evaluation pass, not yet the bug);
- `DataLoader.__iter__` (accelerate's `DataLoaderShard` and Lightning's loops iterate a torch DataLoader
  through it): the user's line that iterates, then at the loader's first `iter()` its generators (F2, before
  the draw that fails) and its sharding (DDP502), and at every `iter()` the epoch of each shuffling
  DistributedSampler in its chain (F7).

torch is imported only when the installer runs (the default group exists by then).
"""

from __future__ import annotations

import functools
import sys
import weakref
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from ..callsite import call_sites
from ..failsafe import failsafe
from ..findings import Finding, Location
from .shuffle_evidence import ShuffleEvidence

if TYPE_CHECKING:
    from .samplers import Place

Report = Callable[[Finding], None]
T = TypeVar("T")

_active = False


def active() -> bool:
    """Whether the guard's loader audits are installed in this process (the Lightning callback then leaves
    the loaders to them)."""
    return _active


def install_loader_audits(report: Report) -> Callable[[], None]:
    """Patch the three entry points; returns the function that restores them."""
    global _active
    import torch.utils.data as data

    sampler_class = data.DistributedSampler
    loader_class = data.DataLoader
    originals = {
        "init": sampler_class.__dict__["__init__"],
        "set_epoch": sampler_class.__dict__["set_epoch"],
        "iter": loader_class.__dict__["__iter__"],
    }
    seen = _SeenLoaders(sampler_class)

    def announce(finding: Finding) -> None:
        report(finding)
        _print_warning(finding)

    seen.evidence = ShuffleEvidence(announce)

    # functools.wraps: `inspect.signature` of a patched method is still the original's (libraries read it)
    @functools.wraps(originals["init"])
    def sampler_init(self: Any, *args: Any, **kwargs: Any) -> None:
        originals["init"](self, *args, **kwargs)
        with failsafe("audits: where a DistributedSampler was built"):
            place = _user_place()
            if place is not None:
                seen.built.put(self, replace(place, library=None))

    @functools.wraps(originals["set_epoch"])
    def set_epoch(self: Any, epoch: int) -> None:
        originals["set_epoch"](self, epoch)
        with failsafe("audits: a set_epoch call"):
            seen.set_epoch_calls.put(self, (seen.set_epoch_calls.get(self) or 0) + 1)

    @functools.wraps(originals["iter"])
    def loader_iter(self: Any) -> Any:
        with failsafe("audits: a loader's iteration"):
            found = seen.audit_iteration(self, _user_place())
            for finding in found:
                announce(finding)
        iterator = originals["iter"](self)
        with failsafe("audits: a suspect loader's pass"):
            seen.evidence.pass_started(self, iterator)
        return iterator

    sampler_class.__init__ = sampler_init  # type: ignore[method-assign]
    sampler_class.set_epoch = set_epoch  # type: ignore[method-assign]
    loader_class.__iter__ = loader_iter  # type: ignore[method-assign]
    _active = True

    def uninstall() -> None:
        global _active
        sampler_class.__init__ = originals["init"]  # type: ignore[method-assign]
        sampler_class.set_epoch = originals["set_epoch"]  # type: ignore[method-assign]
        loader_class.__iter__ = originals["iter"]  # type: ignore[method-assign]
        seen.evidence.uninstall()
        _active = False

    return uninstall


def _user_place() -> Place | None:
    """The user's line two frames above this one's caller (the patched entry point's caller); the library's
    line that iterates where no frame is the user's."""
    from .samplers import Place

    user, library = call_sites(2)
    if user is None:  # library code all the way out (a test script in site-packages): its line, then
        return Place(library.path, library.line) if library is not None else None
    # the library between the user's line and the iteration: Lightning's fit loop, accelerate's loader
    named = library.library if library is not None and library.library not in ("torch", "python") else None
    return Place(user.path, user.line, named)


class _SeenLoaders:
    """What the patched entry points saw of the samplers and loaders of one installation."""

    def __init__(self, sampler_class: type) -> None:
        from .samplers import IterationWatch

        self.sampler_class = sampler_class
        self.built: ByIdentity[Place] = ByIdentity()
        self.set_epoch_calls: ByIdentity[int] = ByIdentity()
        self.first_seen: ByIdentity[bool] = ByIdentity()  # loaders whose first iter() was audited
        self.evidence: ShuffleEvidence  # set by install_loader_audits, with the function that reports
        self.watch = IterationWatch()

    def audit_iteration(self, loader: Any, loop: Place | None) -> list[Finding]:
        from .generators import audit_loader_generators
        from .job import job_world_size
        from .samplers import sampler_chain, unsharded_shuffle

        found: list[Finding] = []
        if self.first_seen.get(loader) is None:
            self.first_seen.put(loader, True)
            where = (Location(loop.path, loop.line),) if loop is not None else ()
            label = f"dataloader iterated at {loop}" if loop is not None else "dataloader"
            first = audit_loader_generators(loader, "dataloader")
            found += [replace(f, locations=where + f.locations) for f in first]
            if not _dispatched_by_accelerate():
                # held until its batches reach the job (shuffle_evidence.py): a rank-local loader is fine
                suspect = unsharded_shuffle(loader, label, job_world_size())
                self.evidence.hold(loader, [replace(f, locations=where + f.locations) for f in suspect])
        for path, sampler in sampler_chain(loader):
            if not isinstance(sampler, self.sampler_class) or not getattr(sampler, "shuffle", False):
                continue
            finding = self.watch.iterated(
                sampler, path, self.set_epoch_calls.get(sampler) or 0, loop, self.built.get(sampler)
            )
            if finding is not None:
                found.append(finding)
        return found


class ByIdentity(Generic[T]):
    """A value per live object, by identity: samplers may be unhashable (an `__eq__` without `__hash__`), and
    an id alone is reused once its object is gone. Objects that take no weak reference are not kept."""

    def __init__(self) -> None:
        self._items: dict[int, tuple[weakref.ref[Any], T]] = {}

    def get(self, obj: Any) -> T | None:
        item = self._items.get(id(obj))
        return item[1] if item is not None and item[0]() is obj else None

    def put(self, obj: Any, value: T) -> None:
        try:
            ref = weakref.ref(obj)
        except TypeError:
            return
        if len(self._items) >= 4096:  # samplers or loaders made per epoch: forget the dead ones
            self._items = {k: v for k, v in self._items.items() if v[0]() is not None}
        self._items[id(obj)] = (ref, value)


def _dispatched_by_accelerate() -> bool:
    """Whether accelerate's `DataLoaderDispatcher` iterates this loader: its main process loads whole batches
    and sends each rank its slice, so the loader it holds does not shard and should not."""
    frame = sys._getframe(3)
    for _ in range(4):
        if frame is None:
            return False
        owner = frame.f_locals.get("self") if "accelerate" in frame.f_code.co_filename else None
        if owner is not None and type(owner).__name__ == "DataLoaderDispatcher":
            return True
        frame = frame.f_back  # type: ignore[assignment]
    return False


def _print_warning(finding: Finding) -> None:
    """The one line a rank prints when it finds something; the summary at the end of the job repeats it."""
    import torch.distributed as dist

    rank = dist.get_rank() if dist.is_initialized() else "?"
    try:
        print(f"[ddpdoctor] {finding.severity.value}: [{finding.class_}] (rank {rank}) {finding.message}",
              file=sys.stderr, flush=True)
    except (OSError, ValueError):  # stderr closed
        pass
