"""The folders a module puts on `sys.path`, evaluated from the spellings research scripts use."""

from __future__ import annotations

import ast
import os

import pytest

from ddpdoctor.check.import_paths import added_folders

HERE = os.path.abspath("/repo/tools/train.py")


@pytest.mark.parametrize(("source", "folders"), [
    ("import os, sys\nsys.path.insert(0, os.path.join(os.path.dirname(__file__), '..', 'lib'))",
     ["/repo/lib"]),
    ("import os.path as osp, sys\nthis_dir = osp.dirname(__file__)\nlib = osp.join(this_dir, '..', 'lib')\n"
     "def add_path(p):\n    if p not in sys.path:\n        sys.path.insert(0, p)\nadd_path(lib)",
     ["/repo/lib"]),
    ("import sys\nfrom pathlib import Path\n"
     "sys.path.append(str(Path(__file__).resolve().parents[1] / 'src'))",
     ["/repo/src"]),
    ("import sys\nsys.path.append('../third_party')", ["/repo/third_party"]),
    ("import sys, site\nsite.addsitedir('vendor')", ["/repo/tools/vendor"]),
    # the working directory and the environment are not known: no folder
    ("import os, sys\nsys.path.insert(0, os.getcwd())\nsys.path.append(os.environ['CODE'])", []),
    ("import sys\nsys.path = ['x']", []),
])
def test_added_folders(source, folders):
    assert list(added_folders(ast.parse(source), HERE)) == [os.path.normpath(f) for f in folders]


def test_a_name_bound_to_itself_gives_up():
    source = "import sys\na = b\nb = a\nsys.path.append(a)"
    assert added_folders(ast.parse(source), HERE) == ()
