"""`DoctorCallback`: the guard and the audits for Lightning users, one line in the Trainer's callbacks.

    trainer = Trainer(strategy="ddp", devices=2, callbacks=[DoctorCallback()])

`setup` installs the runtime guard (`ddpdoctor.guard.install`; `guard=False` skips it, `audits=False` skips
the audits). The audits only warn, never stop training:

- `setup`: a default-device context around `fit` (F2), `trainer.init_module()` included;
- `on_fit_start`: the model's device placement, once the strategy has moved it (F3);
- when Lightning first asks for the train/val loaders (before it iterates them, which is where a
  generator on the wrong device fails): the loaders' generators (F2);
- `on_train_start` / `on_validation_start`: the loaders Lightning actually uses, after it added its
  DistributedSampler: a shuffling loader that does not shard in a multi-rank job (F7);
- the first training batch of each epoch (after every `on_train_epoch_start` hook, the module's own
  included, had its chance to call `set_epoch`): a DistributedSampler whose epoch never changes (F7).

Each `fit` starts the audits afresh: a callback reused across fits (or trainers) judges each on its own.

With the guard running in the process, the loader, generator and sampler audits above are left to the
guard's own (`ddpdoctor.audits.loader_hooks`: every loader at each `iter()`, with the user's lines), and
every finding the callback makes is handed to the guard, which puts it into report.json and the summary
`ddpdoctor run` prints at the end of the job.

Findings are kept on `callback.findings`. Findings about the model differ per rank (rank 1 is where a
foreign `cuda:0` shows up), so every rank prints its own; the others are printed by global rank 0 only.
"""

from __future__ import annotations

import importlib
import logging
import warnings
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from ddpdoctor.findings import Finding, Severity

if TYPE_CHECKING:
    from lightning.pytorch import Callback
else:
    try:
        from lightning.pytorch import Callback
    except ImportError:
        try:
            from pytorch_lightning import Callback
        except ImportError:
            raise ImportError(
                "ddpdoctor.lightning needs Lightning: install `lightning` (or `pytorch_lightning`) >= 2.2"
            ) from None

__all__ = ["DoctorCallback"]

_log = logging.getLogger("ddpdoctor")
_MODEL_CLASSES = frozenset({"foreign-device-hooks", "backend-device-mismatch"})


class DoctorCallback(Callback):
    """Install the ddpdoctor guard for the fit and audit model, loaders and samplers; see the module doc."""

    def __init__(
        self,
        hang_after: float | None = None,
        report_dir: str | None = None,
        remedy: bool = False,
        audits: bool = True,
        guard: bool = True,
    ) -> None:
        from ddpdoctor.audits import EpochWatch

        self.hang_after = hang_after
        self.report_dir = report_dir
        self.remedy = remedy
        self.audits = audits
        self.guard = guard
        self.findings: list[Finding] = []
        self.guard_installed = False
        self._epoch_watch = EpochWatch()
        self._seen: set[tuple[str, str]] = set()
        self._audited_loaders: set[int] = set()
        self._wrapped_sources: list[Any] = []
        self._trainer: Any = None

    # -------------------------------------------------------------------------------------- lifecycle

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        self._trainer = trainer
        if self.guard:
            self._install_guard()
        if self.audits and stage == "fit":
            from ddpdoctor.audits import EpochWatch, audit_default_device

            # a new fit restarts at epoch 0 and may reuse the loaders: nothing carries over from the last
            self._epoch_watch = EpochWatch()
            self._audited_loaders.clear()
            self._seen.clear()

            # `setup` runs inside `trainer.fit(...)`, so a context around that call is still in force here.
            self._audit(trainer, lambda: audit_default_device("trainer.fit"))
            fit_loop = getattr(trainer, "fit_loop", None)
            self._watch_source(getattr(fit_loop, "_data_source", None), "train dataloader")
            val_loop = getattr(getattr(fit_loop, "epoch_loop", None), "val_loop", None)
            self._watch_source(getattr(val_loop, "_data_source", None), "val dataloader")

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        for source in self._wrapped_sources:
            vars(source).pop("dataloader", None)
        self._wrapped_sources = []

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        if not self.audits:
            return
        from ddpdoctor.audits import audit_model

        self._audit(trainer, lambda: audit_model(pl_module, device=trainer.strategy.root_device))

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        if self.audits:
            self._audit_loaders(trainer, trainer.train_dataloader, "train dataloader")

    def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
        if self.audits:
            self._audit_loaders(trainer, trainer.val_dataloaders, "val dataloader")

    def on_sanity_check_start(self, trainer: Any, pl_module: Any) -> None:
        self.on_validation_start(trainer, pl_module)

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        # Not in `on_train_epoch_start`: Lightning calls the callbacks' hook before the module's, where a
        # program may forward `set_epoch` to a sampler Lightning does not reach.
        if self.audits and batch_idx == 0 and not self._loaders_left_to_guard():
            self._audit(
                trainer, lambda: self._epoch_watch.observe(trainer.train_dataloader, "train dataloader")
            )

    # ------------------------------------------------------------------------------------------ parts

    def _install_guard(self) -> None:
        if self.guard_installed:
            return
        try:
            install = importlib.import_module("ddpdoctor.guard").install
        except (ImportError, AttributeError):
            _log.debug("ddpdoctor.guard.install is not available; running the audits only")
            return
        install(hang_after=self.hang_after, report_dir=self.report_dir, remedy=self.remedy)
        self.guard_installed = True

    def _loaders_left_to_guard(self) -> bool:
        """Whether the guard's own loader audits run in this process (installed with the guard once the group
        exists): they check every loader at each `iter()`, naming the user's lines, so the callback's
        loader, sampler and generator audits would only say it twice."""
        try:
            from ddpdoctor.audits.loader_hooks import active
        except ImportError:
            return False
        return active()

    def _watch_source(self, source: Any, label: str) -> None:
        """Audit loaders' generators the moment Lightning gets them, before its first `iter()` can fail.

        Lightning keeps where loaders come from in a `_DataLoaderSource` (a loop's `_data_source`) and calls
        its `dataloader()` right before iterating; an instance attribute shadows that method for this fit.
        """
        original: Callable[[], Any] | None = getattr(source, "dataloader", None)
        if original is None or not hasattr(source, "__dict__") or "dataloader" in vars(source):
            return

        def dataloader() -> Any:
            loaders = original()
            if not self._loaders_left_to_guard():
                self._audit(self._trainer, lambda: self._raw_loader_findings(loaders, label))
            return loaders

        source.dataloader = dataloader
        self._wrapped_sources.append(source)

    def _raw_loader_findings(self, loaders: Any, label: str) -> list[Finding]:
        from ddpdoctor.audits import audit_loader_generators, iter_loaders

        found: list[Finding] = []
        for name, loader in iter_loaders(loaders, label):
            found += audit_loader_generators(loader, name)
        return found

    def _audit_loaders(self, trainer: Any, loaders: Any, label: str) -> None:
        from ddpdoctor.audits import audit_loader, iter_loaders

        def findings() -> list[Finding]:
            found: list[Finding] = []
            if self._loaders_left_to_guard():
                return found
            for name, loader in iter_loaders(loaders, label):
                if id(loader) in self._audited_loaders:
                    continue
                self._audited_loaders.add(id(loader))
                found += audit_loader(loader, name=name, world_size=trainer.world_size)
            return found

        self._audit(trainer, findings)

    def _audit(self, trainer: Any, compute: Callable[[], list[Finding]]) -> None:
        """Run one audit and report it; an audit that breaks is skipped with a warning, never fails the
        fit."""
        try:
            found = compute()
        except Exception as exc:  # noqa: BLE001 - fail open, like the guard
            warnings.warn(
                f"ddpdoctor: an audit failed and was skipped: {exc!r}", RuntimeWarning, stacklevel=2
            )
            return
        self._report(trainer, found)

    # -------------------------------------------------------------------------------------- reporting

    def _report(self, trainer: Any, found: Iterable[Finding]) -> None:
        rank = int(getattr(trainer, "global_rank", 0) or 0)
        new = []
        for finding in found:
            key = (finding.class_, finding.message)
            if key in self._seen:
                continue
            self._seen.add(key)
            self.findings.append(finding)
            self._hand_to_guard(finding)
            if rank == 0 or finding.class_ in _MODEL_CLASSES:
                new.append(finding)
        if not new:
            return
        _print_findings(new, rank)
        for finding in new:
            warnings.warn(_warning_text(finding, rank), _warning_category(), stacklevel=2)


    def _hand_to_guard(self, finding: Finding) -> None:
        """Give a finding to the guard running in this rank, which keeps it with its own: it goes into
        report.json and the summary `ddpdoctor run` prints at the end of the job."""
        try:
            from ddpdoctor.guard import audit_context

            context = audit_context()
            if context is not None:
                context.report(finding)
        except Exception as exc:  # noqa: BLE001 - the fit goes on; the finding was printed all the same
            _log.debug("ddpdoctor: a finding not handed to the guard: %r", exc)


def _warning_category() -> type[Warning]:
    from ddpdoctor.audits import AuditWarning

    return AuditWarning


def _warning_text(finding: Finding, rank: int) -> str:
    text = f"ddpdoctor [{finding.class_}] (rank {rank}): {finding.message}"
    if finding.fix is not None:
        text += f" Fix: {finding.fix.message}"
    return text


_STYLE = {Severity.ERROR: "bold red", Severity.WARNING: "yellow", Severity.INFO: "cyan"}


def _print_findings(findings: list[Finding], rank: int) -> None:
    from rich.console import Group
    from rich.panel import Panel
    from rich.text import Text

    blocks = []
    for finding in findings:
        text = Text()
        text.append(f"{finding.severity.value} ", style=_STYLE[finding.severity])
        text.append(f"[{finding.class_}] ", style="bold")
        text.append(finding.message)
        for evidence in finding.evidence:
            text.append(f"\n  {evidence.text}", style="dim")
        if finding.location is not None:
            text.append(f"\n  at {finding.location}", style="dim")
        if finding.fix is not None:
            text.append("\n  fix: ", style="green")
            text.append(finding.fix.message)
        blocks.append(text)
    from .render.console import make_console

    title = Text(f"ddpdoctor audit, rank {rank}: {len(findings)} finding(s)")
    make_console(stderr=True).print(
        Panel(Group(*blocks), title=title, title_align="left", border_style="yellow")
    )
