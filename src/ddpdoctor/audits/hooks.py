"""The audits the guard runs inside a rank with no code change (`ddpdoctor run`, `ddpdoctor.install()`).

Each entry of `INSTALLERS` patches one entry point that runs once per epoch, per save or per wrap, never per
collective, and returns the function that removes its patch. They are installed when the default process
group exists (the job is then known to have ranks, and the frameworks a program uses are imported by then)
and removed with the guard. The guard hands them an `AuditContext` (context.py): a finding goes to its
`report`, which keeps it with the rank's other findings, where the launcher collects them for report.json
and the summary at the end of the job; the audits that compare ranks reach the job's store through it. An
installer or an audit that raises is one debug line (`failsafe`), never a dead job.
"""

from __future__ import annotations

from collections.abc import Callable

from ..failsafe import failsafe
from .context import AuditContext

Uninstall = Callable[[], None]
Installer = Callable[[AuditContext], Uninstall]


def _loaders(context: AuditContext) -> Uninstall:
    from .loader_hooks import install_loader_audits

    return install_loader_audits(context.report)


def _checkpoints(context: AuditContext) -> Uninstall:
    from .checkpoints import install_checkpoint_audit

    return install_checkpoint_audit(context)


def _wrapping(context: AuditContext) -> Uninstall:
    from .wrapping import install_wrap_audit

    return install_wrap_audit(context.report)


def _replicas(context: AuditContext) -> Uninstall:
    from .replicas import install_replica_audit

    return install_replica_audit(context)


def _sharded_passes(context: AuditContext) -> Uninstall:
    from .sharded_passes import install_sharded_pass_counts

    return install_sharded_pass_counts(context.report)


INSTALLERS: tuple[Installer, ...] = (
    # F7 sampler-epoch, DDP502, F2 generators: DataLoader.__iter__, DistributedSampler.__init__/set_epoch
    _loaders,
    _checkpoints,  # F10: torch.save / safetensors / Lightning's checkpoint IO, once per save
    _wrapping,  # F3: DDP / FSDP / fully_shard / accelerator.prepare, once per wrap
    # F12: the layout at each wrap; a DDP model's digest at passes 2, 4, 8, ... and at destroy_process_group
    _replicas,
    _sharded_passes,  # F11: a forward counter on each sharded root (fully_shard, FSDP)
)

_installed: list[Uninstall] = []


def install_all(context: AuditContext) -> None:
    """Patch every runtime audit's entry point (once: a second call does nothing)."""
    if _installed:
        return
    for installer in INSTALLERS:
        with failsafe(f"audits: {getattr(installer, '__module__', installer)} not installed"):
            _installed.append(installer(context))


def uninstall_all() -> None:
    while _installed:
        remove = _installed.pop()
        with failsafe("audits: a patch not removed"):
            remove()
