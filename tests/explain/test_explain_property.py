"""Whatever bytes arrive, `explain` finishes quickly with a result or a clean InputError: never a crash."""

from __future__ import annotations

import time
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ddpdoctor.errors import InputError
from ddpdoctor.explain import LogSource, explain_logs, knowledge_base

FIXTURES = Path(__file__).parent / "fixtures"
LOGS = sorted(FIXTURES.glob("*.log"))
FRAGMENTS = [
    "[rank0]: ",
    "[rank1]:",
    "[default3]:",
    "Traceback (most recent call last):\n",
    "RuntimeError: ",
    "No backend type associated with device type cpu",
    "Watchdog caught collective operation timeout: WorkNCCL(SeqNum=",
    "Connection closed by peer",
    "exitcode  : -9 (pid: 12)",
    "Root Cause (first observed failure):\n",
    "  rank      : 1 (local_rank: 1)\n",
    "Detected mismatch between collectives on ranks. Rank 0 is running collective: CollectiveFingerPrint(",
    "Expected to have finished reduction in the prior iteration before starting a new one",
    "Parameter indices which did not receive grad for rank 0: ",
    "\x1b[31m",
    "\r",
    "\r\n",
    "\n",
    "(",
    "{rank}",
    "ü",
]
SETTINGS = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def run(tmp_path: Path, data: bytes, block_size: int = 256) -> None:
    path = tmp_path / "fuzz.log"
    path.write_bytes(data)
    started = time.perf_counter()
    try:
        explanation = explain_logs([LogSource.from_arg(str(path))], knowledge_base(), block_size=block_size)
    except InputError:
        return
    assert time.perf_counter() - started < 5
    for diagnosis in explanation.diagnoses:
        assert 0 < (diagnosis.finding.confidence or 0) <= 0.99
        diagnosis.finding.to_dict()


@SETTINGS
@given(data=st.binary(max_size=4000))
def test_random_bytes(tmp_path: Path, data: bytes) -> None:
    run(tmp_path, data)


@SETTINGS
@given(text=st.text(max_size=3000))
def test_random_text(tmp_path: Path, text: str) -> None:
    run(tmp_path, text.encode("utf-8", "surrogatepass"))


@SETTINGS
@given(parts=st.lists(st.sampled_from(FRAGMENTS) | st.text(max_size=20), max_size=200))
def test_log_shaped_noise(tmp_path: Path, parts: list[str]) -> None:
    run(tmp_path, "".join(parts).encode("utf-8", "surrogatepass"))


@SETTINGS
@given(index=st.integers(0, len(LOGS) - 1), cut=st.floats(0, 1), block=st.integers(16, 4096))
def test_truncated_real_logs(tmp_path: Path, index: int, cut: float, block: int) -> None:
    data = LOGS[index].read_bytes()
    run(tmp_path, data[: int(len(data) * cut)], block_size=block)


def test_one_enormous_line_is_bounded(tmp_path: Path) -> None:
    data = b"x" * (20 << 20) + b" No backend type associated with device type cpu\n"
    started = time.perf_counter()
    explanation = explain_logs([LogSource.from_arg(str(_write(tmp_path, data)))], knowledge_base())
    assert time.perf_counter() - started < 10
    assert explanation.diagnoses[0].finding.class_ == "backend-device-mismatch"


def _write(tmp_path: Path, data: bytes) -> Path:
    path = tmp_path / "big.log"
    path.write_bytes(data)
    return path
