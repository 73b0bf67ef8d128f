"""Activates the ddpdoctor guard in every Python process started under `ddpdoctor run`.

`ddpdoctor run` puts this directory first on PYTHONPATH and sets DDPDOCTOR_GUARD=1 (the way coverage.py
reaches subprocesses): torchrun's workers, the DDP workers Lightning re-launches from sys.argv and
`mp.spawn` children all start Python, which imports `sitecustomize` at startup. The guard itself only
arms an import hook here; torch is not imported until the program imports it. Any other sitecustomize
on the path still runs afterwards.
"""

import importlib.machinery
import importlib.util
import os
import sys


def _activate() -> None:
    if os.environ.get("DDPDOCTOR_GUARD") != "1":
        return
    try:
        from ddpdoctor.guard import install
    except ImportError:
        package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
        sys.path.append(package_root)
        from ddpdoctor.guard import install
    install()


def _chain() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    path = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)


try:
    _activate()
except Exception as exc:  # noqa: BLE001 - never stop a program from starting
    print(f"[ddpdoctor] warning: the guard could not start ({type(exc).__name__}: {exc}); running unguarded", file=sys.stderr)
_chain()
