"""`ddpdoctor check` as a user drives it: selection, noqa, configuration, formats, discovery, bad files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

BUG = textwrap.dedent("""\
    import torch.distributed as dist


    def step(t):
        if dist.get_rank() == 0:
            dist.all_reduce(t){comment}
""")
CUDA = textwrap.dedent("""\
    from lightning.pytorch import LightningModule


    class M(LightningModule):
        def forward(self, x):
            return x.cuda()
""")


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


@pytest.fixture
def project(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write(tmp_path / "train.py", BUG.format(comment=""))
    write(tmp_path / "model.py", CUDA)
    return tmp_path


def codes(result) -> list[tuple[str, int, str]]:
    return [(Path(f["path"]).name, f["line"], f["code"]) for f in result.findings]


def test_exit_codes_and_default_path(check, project):
    result = check("--format", "json")
    assert result.code == 1
    assert codes(result) == [("model.py", 6, "DDP402"), ("train.py", 6, "DDP101")]
    assert check("--exit-zero", "--format", "json").code == 0
    write(project / "train.py", "x = 1\n")
    (project / "model.py").unlink()
    clean = check()
    assert clean.code == 0 and "All checks passed!" in clean.out


def test_usage_errors_exit_2(check, project):
    bad_code = check("--select", "XYZ9")
    assert bad_code.code == 2 and "unknown rule code or prefix 'XYZ9'" in bad_code.err
    assert check("--jobs", "0").code == 2
    assert check("--format", "yaml").code == 2
    empty = project / "empty"
    empty.mkdir()
    assert check(str(empty)).code == 2


def test_select_ignore_prefixes(check, project):
    assert codes(check("--select", "DDP1", "--format", "json")) == [("train.py", 6, "DDP101")]
    assert codes(check("--ignore", "DDP4", "--format", "json")) == [("train.py", 6, "DDP101")]
    # the more specific prefix wins, as in ruff
    assert codes(check("--select", "DDP101", "--ignore", "DDP1", "--format", "json")) == [
        ("train.py", 6, "DDP101")
    ]
    assert codes(check("--select", "DDP4", "--extend-select", "DDP101", "--format", "json")) == [
        ("model.py", 6, "DDP402"), ("train.py", 6, "DDP101")]


@pytest.mark.parametrize("comment, silenced", [
    ("  # noqa", True),
    ("  # noqa: DDP101", True),
    ("  # NOQA:DDP402,DDP101", True),
    ("  # noqa: DDP402", False),
])
def test_noqa(check, project, comment, silenced):
    write(project / "train.py", BUG.format(comment=comment))
    result = check("train.py", "--format", "json")
    assert (result.findings == []) is silenced


def test_pyproject_configuration(check, project):
    write(project / "legacy" / "old.py", BUG.format(comment=""))
    write(project / "tests" / "test_x.py", CUDA)
    write(project / "pyproject.toml", textwrap.dedent("""\
        [project]
        name = "x"

        [tool.ddpdoctor]
        ignore = ["DDP601"]
        exclude = ["legacy/"]
        per-file-ignores = { "tests/*" = ["DDP402"] }
    """))
    os.chdir(project / "tests")  # the configuration is found from a subdirectory too
    result = check(str(project), "--format", "json")
    assert sorted(codes(result)) == [("model.py", 6, "DDP402"), ("train.py", 6, "DDP101")]
    assert check(str(project), "--isolated", "--format", "json").code == 1
    assert len(check(str(project), "--isolated", "--format", "json").findings) == 4
    # a named file is checked even when excluded (ruff's behaviour without --force-exclude)
    assert codes(check(str(project / "legacy" / "old.py"), "--format", "json")) == [("old.py", 6, "DDP101")]
    write(project / "pyproject.toml", "[tool.ddpdoctor]\nselct = ['DDP']\n")
    broken = check(str(project))
    assert broken.code == 2 and "unknown key" in broken.err
    write(project / "pyproject.toml", "[tool.ddpdoctor\n")
    assert check(str(project)).code == 2


def test_discovery_skips_vcs_venvs_and_site_packages_unless_named(check, project):
    for hidden in (".git/hooks/x.py", "env/lib/python3.11/site-packages/pkg/x.py", "myvenv/lib/x.py",
                   "node_modules/x.py"):
        write(project / hidden, BUG.format(comment=""))
    write(project / "myvenv" / "pyvenv.cfg", "home = /usr\n")
    write(project / "dist" / "x.py", BUG.format(comment=""))  # a build output: skipped
    write(project / "pkg" / "dist" / "__init__.py", "")  # a package named `dist` (mmengine's): source
    write(project / "pkg" / "dist" / "comm.py", BUG.format(comment=""))
    result = check("--format", "json")
    assert sorted({Path(f["path"]).name for f in result.findings}) == ["comm.py", "model.py", "train.py"]
    named = check(str(project / "env" / "lib" / "python3.11" / "site-packages"), "--format", "json")
    assert codes(named) == [("x.py", 6, "DDP101")]


def test_bad_files_get_one_line_each_and_the_run_goes_on(check, project):
    write(project / "syntax.py", "def broken(:\n    pass\n")
    (project / "latin1.py").write_bytes(b"x = 'caf\xe9'\n")
    (project / "declared.py").write_bytes(b"# -*- coding: latin-1 -*-\nx = 'caf\xe9'\n")
    (project / "nul.py").write_bytes(b"x = 1\x00\n")
    os.symlink(project / "nowhere.py", project / "dangling.py")
    os.mkfifo(project / "pipe.py")
    with open(project / "huge.py", "wb") as handle:
        handle.write(b"# padding\n" * (1_100_000))
    result = check("--format", "json")
    assert result.code == 1
    by_file = {Path(f["path"]).name: f for f in result.findings}
    assert by_file["syntax.py"]["code"] == "E999" and by_file["syntax.py"]["line"] == 1
    # the grammar is the running Python's: the message says which, for code written for a newer one
    assert f"(Python {sys.version_info.major}.{sys.version_info.minor})" in by_file["syntax.py"]["message"]
    assert by_file["latin1.py"]["code"] == "E902" and "not valid UTF-8" in by_file["latin1.py"]["message"]
    assert (by_file["latin1.py"]["line"], by_file["latin1.py"]["column"]) == (1, 9)
    assert "declared.py" not in by_file  # a PEP 263 coding cookie is honoured
    assert by_file["nul.py"]["code"] == "E999"
    assert (
        by_file["dangling.py"]["code"] == "E902"
        and "broken symbolic link" in by_file["dangling.py"]["message"]
    )
    assert by_file["pipe.py"]["message"] == "not a regular file"
    assert "too large" in by_file["huge.py"]["message"]
    assert by_file["train.py"]["code"] == "DDP101"  # the good files were still checked
    text = check()
    assert "Traceback" not in text.out + text.err
    assert "syntax.py:1:" in text.out
    missing = check("does_not_exist.py", "--format", "json")
    assert missing.code == 1 and missing.findings[0]["message"] == "no such file"


def test_formats(check, project):
    sarif = json.loads(check("--format", "sarif").out)
    run = sarif["runs"][0]
    assert sarif["version"] == "2.1.0" and run["tool"]["driver"]["name"] == "ddpdoctor"
    assert {r["ruleId"] for r in run["results"]} == {"DDP101", "DDP402"}
    region = next(r for r in run["results"] if r["ruleId"] == "DDP101")["locations"][0]["physicalLocation"][
        "region"
    ]
    assert region["startLine"] == 6 and region["startColumn"] == 9
    github = check("--format", "github").out.splitlines()
    assert github[1].startswith("::error file=train.py,line=6,col=9,endLine=6,endColumn=27,title=DDP101")
    assert github[0].startswith("::warning file=model.py,line=6")
    text = check().out
    assert "train.py:6:9: DDP101" in text and "dist.all_reduce(t)" in text and "^^^^" in text
    assert "Found 2 findings." in text
    data = check("--format", "json").findings
    assert set(data[0]) >= {"code", "class", "severity", "path", "line", "column", "end_line", "end_column",
                            "message", "fix"}


def test_statistics(check, project):
    result = check("--statistics")
    assert result.code == 1
    lines = [line.split() for line in result.out.splitlines()]
    assert ["1", "DDP101", "rank-conditional-collective"] in lines
    assert ["1", "DDP402", "hardcoded-device"] in lines


def test_parallel_jobs_give_the_same_findings(check, project):
    for i in range(40):
        write(project / "pkg" / f"m{i}.py", BUG.format(comment="") if i % 3 == 0 else "x = 1\n")
    serial = check("--jobs", "1", "--format", "json").findings
    parallel = check("--jobs", "2", "--format", "json").findings
    assert serial == parallel and len(serial) == 2 + 14


def test_console_script_without_terminal(project):
    """The installed command, in a fresh process: no progress bar or colour when stderr is not a terminal."""
    exe = Path(sys.executable).with_name("ddpdoctor")
    done = subprocess.run([str(exe), "check", "."], capture_output=True, text=True, timeout=60, cwd=project,
                          env={**os.environ, "NO_COLOR": "1"})
    assert done.returncode == 1
    assert done.stderr == ""
    assert "\x1b[" not in done.stdout
    assert "train.py:6:9: DDP101" in done.stdout


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their mode")
def test_unreadable_file(check, project):
    secret = write(project / "secret.py", "x = 1\n")
    os.chmod(secret, 0)
    result = check("--format", "json")
    assert any(f["code"] == "E902" and f["path"].endswith("secret.py") for f in result.findings)


def test_progress_goes_to_a_terminal_stderr_only(tmp_path):
    import pty

    for i in range(210):
        write(tmp_path / f"m{i:03}.py", "x = 1\n")
    exe = Path(sys.executable).with_name("ddpdoctor")
    master, slave = pty.openpty()
    seen = bytearray()

    def drain() -> None:  # a pty's buffer is small: read it while the command runs
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:
                return
            if not chunk:
                return
            seen.extend(chunk)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    try:
        done = subprocess.run([str(exe), "check", ".", "--jobs", "1"], stdout=subprocess.PIPE, stderr=slave,
                              text=True, timeout=60, cwd=tmp_path, env={**os.environ, "TERM": "xterm"})
    finally:
        os.close(slave)
        reader.join(timeout=5)
        os.close(master)
    assert done.returncode == 0
    assert b"checking" in seen
    assert "checking" not in done.stdout and "All checks passed!" in done.stdout


def test_checking_and_fixing_need_neither_torch_nor_libcst(project):
    """Fixes are text edits from `ast` positions: no concrete-syntax library is loaded, even with --fix."""
    write(project / "model.py", CUDA)
    code = (
        "import sys; from ddpdoctor.cli import main; rc = main(['check', '.', '--fix', '--unsafe-fixes']); "
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'libcst', 'lightning')); "
        "print('LOADED', loaded); sys.exit(rc)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=project
    )
    assert "LOADED []" in done.stdout
    assert "x.to(self.device)" in (project / "model.py").read_text(encoding="utf-8")
