"""`ddpdoctor explain` as a user runs it: formats, exit codes, stdin, bad input."""

from __future__ import annotations

import json
from pathlib import Path

from ddpdoctor.findings import Finding, loads

FIXTURES = Path(__file__).parent / "fixtures"


def diagnoses(stdout: str) -> list[Finding]:
    """`explain --format json`'s output: the documented Finding list (docs/json.md), read back."""
    return loads(stdout)


def test_json_is_the_documented_finding_list(cli) -> None:
    """(tests/render/test_explain_formats.py checks the facts a diagnosis carries in detail.)"""
    result = cli("explain", str(FIXTURES / "f6_sigkill.log"), "--format", "json")
    assert result.returncode == 0, result.stderr
    first = diagnoses(result.stdout)[0]
    assert first.class_ == "dead-rank"
    assert first.facts["culprit_rank"] == 1
    assert first.facts["signal"] == "SIGKILL"
    assert first.message and first.references
    assert first.fix is not None and first.fix.message.startswith("Rank 1 was killed (SIGKILL)")
    assert all(isinstance(item.line, int) for item in first.evidence)
    # the log-specific explanation, most specific first
    assert first.facts["what_happened"][0].startswith("SIGKILL is what the kernel's OOM killer")


def test_text_output_names_class_culprit_and_fix(cli) -> None:
    result = cli("explain", str(FIXTURES / "f4_detail_mismatch.log"))
    assert result.returncode == 0, result.stderr
    out = " ".join(result.stdout.split())  # undo the terminal wrapping
    assert "1. collective-divergence" in out
    assert "rank 0 runs ALLREDUCE (shape [3], Float) while rank 1 runs BROADCAST" in out
    assert "Fix" in out and "Evidence" in out
    assert "Traceback" not in result.stderr


def test_markdown_is_pasteable(cli) -> None:
    result = cli("explain", str(FIXTURES / "accelerate_hooks_device.log"), "--format", "markdown")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert out.startswith("### 1. ")
    assert "`foreign-device-hooks` (F3)" in out
    assert "| device_a | `cuda:1` |" in out
    assert "```text" in out and out.count("```") % 2 == 0


def test_stdin(cli) -> None:
    log = (FIXTURES / "f9_no_init.log").read_text()
    result = cli("explain", "-", "--format", "json", stdin=log)
    assert result.returncode == 0, result.stderr
    assert diagnoses(result.stdout)[0].class_ == "process-group-missing"


def test_several_files_are_one_job(cli, tmp_path: Path) -> None:
    # torchrun --log-dir style: one file per rank; the file name gives the rank
    lines = (FIXTURES / "f6_gloo_timeout.log").read_text().splitlines()
    rank0 = [line.removeprefix("[rank0]: ") for line in lines if line.startswith("[rank0]:")]
    (tmp_path / "rank0.log").write_text("\n".join(rank0) + "\n")
    (tmp_path / "rank1.log").write_text("waiting for data ...\n")
    result = cli("explain", str(tmp_path / "rank0.log"), str(tmp_path / "rank1.log"), "--format", "json")
    assert result.returncode == 0, result.stderr
    first = diagnoses(result.stdout)[0]
    assert first.facts["reporting_ranks"] == [0] and first.facts["silent_ranks"] == [1]
    assert first.evidence[0].rank == 0
    assert first.evidence[0].text.startswith(f"{tmp_path / 'rank0.log'}: RuntimeError")


def test_nothing_recognised_exits_1_and_keeps_json_on_stdout_clean(cli, tmp_path: Path) -> None:
    """(test_explain_stopped.py checks the one line the text format prints instead.)"""
    log = tmp_path / "fine.log"
    log.write_text("Epoch 1: loss=0.3\nTraceback (most recent call last):\nKeyError: 'x'\n")
    as_json = cli("explain", str(log), "--format", "json")
    assert as_json.returncode == 1 and json.loads(as_json.stdout) == []
    assert "no distributed-training failure" in as_json.stderr and as_json.stderr.count("\n") == 1


def test_empty_log_is_not_an_error(cli, tmp_path: Path) -> None:
    (tmp_path / "empty.log").write_bytes(b"")
    result = cli("explain", str(tmp_path / "empty.log"))
    assert result.returncode == 1 and "empty (0 lines)" in result.stdout


def test_unreadable_inputs_exit_2_with_one_line(cli, tmp_path: Path) -> None:
    binary = tmp_path / "core.bin"
    binary.write_bytes(b"\x7fELF\x02\x01\x01\x00" + bytes(range(256)) * 10)
    cases = {
        str(tmp_path / "missing.log"): "no such file",
        str(tmp_path): "is a directory",
        str(binary): "binary data",
    }
    for path, message in cases.items():
        result = cli("explain", path)
        assert result.returncode == 2, path
        assert message in result.stderr
        assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1
    # a bad file among good ones is still an error, reported before any output
    result = cli("explain", str(FIXTURES / "f1_cuda_gloo.log"), str(tmp_path / "missing.log"))
    assert result.returncode == 2 and result.stdout == ""


def test_utf16_log_from_powershell_is_read(cli, tmp_path: Path) -> None:
    log = tmp_path / "ps.log"
    log.write_bytes((FIXTURES / "f8_unused.log").read_text().encode("utf-16"))
    result = cli("explain", str(log), "--format", "json")
    assert result.returncode == 0, result.stderr
    assert diagnoses(result.stdout)[0].facts["parameter_indices"] == "2 3"


def test_limit(cli) -> None:
    result = cli("explain", str(FIXTURES / "f4_shape_mismatch.log"), "--format", "json", "--limit", "1")
    assert [d.class_ for d in diagnoses(result.stdout)] == ["collective-divergence"]


def test_usage_errors_exit_2(cli) -> None:
    log = str(FIXTURES / "f1_cuda_gloo.log")
    # html is a format of the registry, but not one explain has
    for args in (["-", "-"], [log, "--limit", "-1"], [log, "--format", "yaml"], [log, "--format", "html"]):
        result = cli("explain", *args, stdin="")
        assert result.returncode == 2, args
        assert "Traceback" not in result.stderr


def test_binary_stdin_exits_2(cli) -> None:
    result = cli("explain", "-", stdin="\x00\x01\x02 not a log")
    assert result.returncode == 2 and "binary data" in result.stderr


def test_gzipped_logs_are_read(cli, tmp_path: Path) -> None:
    import gzip

    log = tmp_path / "train.log.gz"
    log.write_bytes(gzip.compress((FIXTURES / "f6_sigkill.log").read_bytes()))
    result = cli("explain", str(log), "--format", "json")
    assert result.returncode == 0, result.stderr
    assert diagnoses(result.stdout)[0].facts["culprit_rank"] == 1
    piped = cli("explain", "-", "--format", "json", stdin=None)
    assert piped.returncode == 1  # empty stdin: nothing to explain, no error
    broken = tmp_path / "broken.log.gz"
    packed = gzip.compress(
        b"".join((FIXTURES / name).read_bytes() for name in ("f1_cuda_gloo.log", "f8_unused.log"))
    )
    broken.write_bytes(packed[: len(packed) // 2])  # cut mid-stream
    result = cli("explain", str(broken))
    assert result.returncode == 2 and "cannot read" in result.stderr and "Traceback" not in result.stderr
