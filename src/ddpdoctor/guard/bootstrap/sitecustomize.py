"""Activates the ddpdoctor guard in every Python process started under `ddpdoctor run`.

`ddpdoctor run` puts this directory first on PYTHONPATH and sets DDPDOCTOR_GUARD=1 (the way coverage.py
reaches subprocesses): torchrun's workers, the DDP workers Lightning re-launches from sys.argv and
`mp.spawn` children all start Python, which imports `sitecustomize` at startup. The guard itself only
arms an import hook here; torch is not imported until the program imports it. Any other sitecustomize
on the path still runs afterwards.

Every Python the job starts reads this file, tools in other interpreters included (a Python 2 script, a
system Python 3.8): so it parses there too (no f-strings), and it stays silent in an interpreter older
than the guard supports unless that interpreter could be a rank (it has torch).
"""

from __future__ import print_function

import os
import sys

SUPPORTED = (3, 10)


def _activate():
    if os.environ.get("DDPDOCTOR_GUARD") != "1":
        return
    if sys.version_info < SUPPORTED:
        import importlib.util

        if importlib.util.find_spec("torch") is not None:
            print(
                "[ddpdoctor] warning: Python %d.%d is older than the guard supports (3.10+); this process "
                "runs unguarded" % sys.version_info[:2],
                file=sys.stderr,
            )
        return
    try:
        from ddpdoctor.guard import install
    except ImportError:
        # Another Python than the one ddpdoctor is installed in. Its install directory (for a wheel: a
        # whole site-packages) goes on sys.path only while the guard and its renderer are imported, so
        # that the program does not find the other packages there.
        package_root = os.path.dirname(
            os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        )
        sys.path.append(package_root)
        try:
            # imported later, once torch.distributed is ready, when this path is gone again
            import ddpdoctor.guard.rank.monitor  # noqa: F401
            import ddpdoctor.guard.rank.runtime  # noqa: F401
            from ddpdoctor.guard import install
            try:
                import rich.console  # noqa: F401
                import rich.panel  # noqa: F401
                import rich.table  # noqa: F401
                import rich.text  # noqa: F401
            except ImportError:  # the launcher prints the report from the files then
                pass
        finally:
            if package_root in sys.path:
                sys.path.remove(package_root)
    install()


def _is_bootstrap(path):
    """This directory, or another ddpdoctor installation's (chaining to it would come back here)."""
    parts = os.path.abspath(path or os.curdir).split(os.sep)
    return parts[-3:] == ["ddpdoctor", "guard", "bootstrap"]


def _chain():
    import importlib.machinery
    import importlib.util

    path = [p for p in sys.path if not _is_bootstrap(p)]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    # `import sitecustomize` then gives the program its own module, as it would without the guard.
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


if sys.version_info >= (3, 5):  # Python 2 has neither the guard nor these importlib functions
    try:
        _activate()
    except Exception as exc:  # noqa: BLE001 - never stop a program from starting
        print(
            "[ddpdoctor] warning: the guard could not start (%s: %s); running unguarded"
            % (type(exc).__name__, exc),
            file=sys.stderr,
        )
    _chain()
