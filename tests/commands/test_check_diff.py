"""`ddpdoctor check --diff`: a diff that `git apply` and `patch -p1` take as they are."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "collective-divergence" / "lightning_broken.py"


def _headers(diff: str) -> list[str]:
    return [line for line in diff.splitlines() if line.startswith(("--- ", "+++ "))]


def test_a_file_outside_the_working_directory_gets_git_style_paths(cli, tmp_path: Path) -> None:
    target = tmp_path / "train.py"
    shutil.copy(EXAMPLE, target)
    result = cli("check", "--diff", str(target), cwd=str(EXAMPLE.parent))
    absolute = str(target).lstrip("/")
    assert _headers(result.stdout) == [f"--- a/{absolute}", f"+++ b/{absolute}"], result.stdout
    # as git writes it, `patch -p1` from / applies it
    assert "a//" not in result.stdout


def test_a_file_under_the_working_directory_gets_relative_paths_that_git_apply_takes(
    cli, tmp_path: Path
) -> None:
    (tmp_path / "src").mkdir()
    target = tmp_path / "src" / "train.py"
    shutil.copy(EXAMPLE, target)
    result = cli("check", "--diff", str(target), cwd=str(tmp_path))
    assert _headers(result.stdout) == ["--- a/src/train.py", "+++ b/src/train.py"], result.stdout
    patch = tmp_path / "fix.patch"
    diff_only = "".join(line + "\n" for line in result.stdout.splitlines()
                        if not line.startswith("Would fix"))
    patch.write_text(diff_only)
    git = shutil.which("git")
    if git:
        applied = subprocess.run([git, "apply", "--check", str(patch)], cwd=tmp_path, capture_output=True,
                                 text=True, timeout=30)
        assert applied.returncode == 0, applied.stderr
