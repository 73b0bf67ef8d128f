"""Interception in one process (a real 1-rank gloo group): fingerprints, names bound before install, F1."""

from __future__ import annotations

import subprocess
import sys
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from guard_jobs import free_port, job_env

import ddpdoctor.guard as guard
from ddpdoctor.audits.backend_device import BackendDeviceMismatchError
from ddpdoctor.findings import Finding, Severity

THIS_FILE = str(Path(__file__).resolve())


@pytest.fixture
def one_rank(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[None]:
    backend = getattr(request, "param", "gloo")
    guard.uninstall()
    store = dist.TCPStore("127.0.0.1", free_port(), 1, True)
    try:
        dist.init_process_group(backend, store=store, rank=0, world_size=1)
        yield
    finally:
        guard.uninstall()
        if dist.is_initialized():
            dist.destroy_process_group()


def line_of(marker: str) -> int:
    for number, text in enumerate(Path(__file__).read_text().splitlines(), 1):
        if marker in text and "line_of" not in text:
            return number
    raise AssertionError(marker)


def test_install_after_init_records_fingerprints(one_rank: None, tmp_path: Path) -> None:
    guard.install(report_dir=str(tmp_path))
    runtime = guard.current_runtime()
    assert runtime.rank == 0 and runtime.monitor is not None
    x = torch.ones(3, 2, dtype=torch.float64)
    dist.all_reduce(x, op=dist.ReduceOp.MAX)  # marker:fp-call
    dist.broadcast(x, src=0)
    first, second = runtime.recent()[-2:]
    assert (first.op, first.reduce_op, first.shapes, first.dtypes, first.devices) == (
        "all_reduce", "MAX", [[3, 2]], ["float64"], ["cpu"]
    )
    assert first.site is not None and first.site.path == THIS_FILE
    assert first.site.line == line_of("marker:fp-call")
    assert first.library is None  # called directly by user code
    assert (second.op, second.root, second.seq) == ("broadcast", 0, first.seq + 1)
    assert first.state == second.state == "done" and runtime.current is None


def test_an_audit_the_guard_did_not_install_gets_the_audits_context_not_the_runtime(
    one_rank: None, tmp_path: Path
) -> None:
    """`guard.audit_context()` (the Lightning callback's way to the report) is the interface the guard's
    own audits get: a finding kept with the rank's, no store in a one-rank job, the sequence number."""
    assert guard.audit_context() is None  # no guard installed
    guard.install(report_dir=str(tmp_path))
    context = guard.audit_context()
    assert context is not None
    finding = Finding(class_="device-placement", message="a test finding", severity=Severity.WARNING)
    context.report(finding)
    assert finding in list(guard.current_runtime().findings)
    assert context.store("test") is None  # one rank: nothing to compare with
    before = context.sequence()
    dist.all_reduce(torch.ones(1))
    assert context.sequence() == before + 1


def test_the_single_tensor_collectives_new_in_torch_2_13_are_guarded(one_rank: None) -> None:
    if not hasattr(dist, "all_gather_single"):
        pytest.skip("torch before 2.13")
    guard.install()
    dist.all_gather_single(torch.zeros(2), torch.ones(2))
    dist.reduce_scatter_single(torch.zeros(2), torch.ones(2))
    ops = [fp.op for fp in guard.current_runtime().recent()]
    assert ops == ["all_gather_single", "reduce_scatter_single"]


def test_an_all_gathers_own_piece_is_not_compared_only_the_list(one_rank: None) -> None:
    """NCCL gathers uneven pieces (each rank's input sized as its entry of the output list): the input's
    shape differs between healthy ranks, the output list's does not."""
    guard.install()
    dist.all_gather([torch.zeros(3, 2)], torch.ones(3, 2))
    recorded = guard.current_runtime().recent()[-1]
    assert recorded.op == "all_gather"
    assert recorded.shapes == [[3, 2]] and recorded.devices == ["cpu", "cpu"]


def test_names_bound_before_install_are_guarded(one_rank: None) -> None:
    from torch.distributed import all_reduce as bound_early

    namespace = {"reduce_it": bound_early}
    sys.modules["_ddpdoctor_test_bound"] = type(sys)("_ddpdoctor_test_bound")
    sys.modules["_ddpdoctor_test_bound"].__dict__.update(namespace)
    try:
        guard.install()
        rebound = sys.modules["_ddpdoctor_test_bound"].reduce_it
        assert rebound is not bound_early and rebound.__ddpdoctor_original__ is bound_early
        rebound(torch.ones(1))
        assert guard.current_runtime().recent()[-1].op == "all_reduce"
    finally:
        del sys.modules["_ddpdoctor_test_bound"]
    guard.uninstall()
    assert dist.all_reduce is bound_early  # uninstall restores the originals


def test_a_second_install_changes_the_settings_of_the_running_guard(one_rank: None) -> None:
    """`ddpdoctor run` installs the guard before the program's own `install(...)`: the program's
    arguments must still apply, without wrapping anything twice."""
    guard.install()
    runtime = guard.current_runtime()
    guard.install(hang_after=1, remedy=True)
    assert guard.current_runtime() is runtime
    assert (runtime.config.hang_after, runtime.config.remedy) == (1.0, True)
    dist.all_reduce(torch.ones(1))
    assert len(runtime.recent()) == 1  # not wrapped twice


def test_a_users_own_shim_over_a_collective_is_kept(one_rank: None) -> None:
    """A profiling shim assigned to `dist.all_reduce` before install: it stays in place and still runs, and
    the original it holds in a module global is guarded."""
    shim_module = type(sys)("_ddpdoctor_test_shim")
    exec(
        "import torch.distributed as dist\n"
        "calls = []\n"
        "original = dist.all_reduce\n"
        "def counting_all_reduce(*args, **kwargs):\n"
        "    calls.append(1)\n"
        "    return original(*args, **kwargs)\n",
        shim_module.__dict__,
    )
    sys.modules[shim_module.__name__] = shim_module
    real = dist.all_reduce
    dist.all_reduce = shim_module.counting_all_reduce
    try:
        guard.install()
        assert dist.all_reduce is shim_module.counting_all_reduce
        dist.all_reduce(torch.ones(1))
        assert shim_module.calls == [1]
        assert [fp.op for fp in guard.current_runtime().recent()] == ["all_reduce"]
        guard.uninstall()
        assert dist.all_reduce is shim_module.counting_all_reduce
    finally:
        dist.all_reduce = real
        del sys.modules[shim_module.__name__]


def test_a_root_that_is_not_a_rank_gets_torchs_error_and_the_guard_stays_on(
    one_rank: None, capsys: pytest.CaptureFixture[str]
) -> None:
    guard.install()
    with pytest.raises((TypeError, ValueError)):
        dist.broadcast(torch.ones(1), src="a")
    dist.all_reduce(torch.ones(1))
    runtime = guard.current_runtime()
    assert not runtime.disabled and "disabled itself" not in capsys.readouterr().err
    assert runtime.recent()[-1].op == "all_reduce"


def test_a_warning_torch_raises_inside_a_collective_points_at_the_caller(one_rank: None) -> None:
    guard.install()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dist.monitored_barrier(timeout=30.0)  # marker:warning-call (torch: "specify timeout as a timedelta")
    assert [(w.filename, w.lineno) for w in caught] == [(THIS_FILE, line_of("marker:warning-call"))]
    assert guard.current_runtime().recent()[-1].op == "monitored_barrier"


@pytest.mark.parametrize("one_rank", ["cuda:gloo"], indirect=True)
def test_cpu_tensor_on_cuda_only_group_raises_a_precise_error(one_rank: None) -> None:
    guard.install()
    with pytest.raises(BackendDeviceMismatchError) as caught:
        dist.all_reduce(torch.ones(2, 3))  # marker:f1-call
    text = str(caught.value)
    assert "tensor of shape [2, 3] dtype float32 on cpu" in text
    assert "has backends only for cuda" in text
    assert f"{THIS_FILE}:{line_of('marker:f1-call')}" in text
    assert isinstance(caught.value, RuntimeError)  # code catching torch's RuntimeError still catches it
    assert caught.value.finding.class_ == "backend-device-mismatch"


def test_a_line_that_passed_a_device_its_group_has_is_checked_again_for_another(one_rank: None) -> None:
    """The hot path checks F1 only for a line's new arguments (a line is kept once its devices were found
    fine): the same line passing a device its gloo group has no backend for still gets the error."""
    guard.install()
    raised = []
    for tensor in (torch.ones(2), torch.ones(2), torch.ones(2, device="meta")):
        try:
            dist.all_reduce(tensor)  # marker:f1-again
        except BackendDeviceMismatchError as caught:
            raised.append(str(caught))
    assert len(raised) == 1 and "on meta" in raised[0]
    assert f"{THIS_FILE}:{line_of('marker:f1-again')}" in raised[0]


def test_the_collectives_torch_makes_inside_a_guarded_one_pass_straight_through(one_rank: None) -> None:
    """`all_gather_object` runs two `all_gather`s inside: one call is recorded, from the main thread and from
    another (the wrapper keeps the two threads' flags apart)."""
    guard.install()
    runtime = guard.current_runtime()

    def gather() -> None:
        out: list = [None]
        dist.all_gather_object(out, {"step": 1})
        assert out == [{"step": 1}]

    for run in (gather, lambda: (thread := threading.Thread(target=gather), thread.start(), thread.join())):
        before = runtime.ring.count
        run()
        assert [fp.signature.op for fp in runtime.ring.recent()[before - runtime.ring.count:]] == [
            "all_gather_object"]
    dist.all_reduce(torch.ones(1))  # and the flag is down again: the next call is recorded
    assert runtime.ring.recent()[-1].signature.op == "all_reduce"


def test_a_repeated_call_is_recorded_by_the_wrapper_as_before_would(one_rank: None) -> None:
    """A line's same call again is recorded by the wrapper's fast path, not by `before`/`after`: numbered on,
    its sequence number the group's, done, not current, and its flight slot the same record as the ring's."""
    from dataclasses import replace

    from ddpdoctor.guard.fingerprint import EnteredFingerprint
    from ddpdoctor.guard.judge.flight_files import read_flight

    guard.install()
    runtime = guard.current_runtime()
    x = torch.ones(2)
    for _ in range(4):  # the first one or two describe the line (its file classified first) and keep its plan
        dist.all_reduce(x)  # marker:repeat
    first, *again = runtime.ring.recent()[-4:]
    assert type(first) is not EnteredFingerprint
    assert [type(fp) for fp in again[1:]] == [EnteredFingerprint] * 2
    assert [(fp.index, fp.seq) for fp in again] == [(first.index + n, first.seq + n) for n in (1, 2, 3)]
    assert all(fp.signature is first.signature for fp in again)
    assert runtime.current is None and runtime.sequence_numbers()[first.group] == first.seq + 4
    records = [fp.record() for fp in (first, *again)]
    assert [replace(r, index=0, seq=0, time=0.0) for r in records[1:]] == [
        replace(records[0], index=0, seq=0, time=0.0)] * 3
    assert runtime.flight is not None
    flown = {call.index: call for call in read_flight(runtime.flight.path)}
    assert [flown[r.index] for r in records] == [replace(r, time=flown[r.index].time) for r in records]
    assert all(abs(flown[r.index].time - r.time) < 1e-3 for r in records)


def test_a_paused_or_disabled_guard_stops_the_fast_path(
    one_rank: None, capsys: pytest.CaptureFixture[str]
) -> None:
    """The fast path takes a line's plan only from `runtime.fast`, which pausing (a post-mortem that decided
    nothing) and disabling replace: a repeated call after a pause goes through `before` (which resumes the
    monitor) and is fast again after it; after the guard disabled itself nothing more is recorded."""
    from ddpdoctor.guard.fingerprint import EnteredFingerprint

    guard.install()
    runtime = guard.current_runtime()
    x = torch.ones(2)

    class Paused:
        resumed = 0

        def resume(self) -> None:
            self.resumed += 1

    def repeat(times: int) -> list:
        before = runtime.ring.count
        for _ in range(times):
            dist.all_reduce(x)  # marker:paused
        return [type(fp) for fp in runtime.ring.recent()[before - runtime.ring.count:]] if times else []

    assert repeat(4)[2:] == [EnteredFingerprint] * 2  # the first one or two describe the line
    paused = Paused()
    runtime.paused = paused
    runtime.hold_fast_path()  # as the post-mortem does
    kinds = repeat(3)
    assert paused.resumed == 1 and runtime.paused is None
    assert kinds[0] is not EnteredFingerprint and kinds[1:] == [EnteredFingerprint] * 2
    runtime.fail_open(RuntimeError("made-up guard bug"))
    assert runtime.disabled
    count = runtime.ring.count
    repeat(2)
    assert runtime.ring.count == count
    assert "disabled itself" in capsys.readouterr().err


def test_the_fast_path_skips_torchs_logging_decorator_but_not_its_log(one_rank: None) -> None:
    """A repeated call runs torch's function under its `_exception_logger` (a frame and a dict less per call);
    an error it raises is still logged by that decorator, with the same message, and reaches the caller as
    the same exception, its traceback without the re-logging's frames."""
    import logging

    from torch.distributed import c10d_logger

    from ddpdoctor.guard.rank.intercept import OpSpec, original
    from ddpdoctor.guard.rank.wrapper_importlib_bootstrap import make_wrapper

    callers: list[str] = []

    @c10d_logger._exception_logger
    def made_up_reduce(tensor: torch.Tensor, op: object = None, group: object = None) -> None:
        callers.append(sys._getframe(1).f_code.co_name)  # `wrapper` (torch's decorator) or `guarded`
        if len(callers) == 4:
            raise ValueError("made-up failure")

    guard.install()
    wrapper = make_wrapper(OpSpec("all_reduce", original("all_reduce")), made_up_reduce)
    logged: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = logged.append  # type: ignore[method-assign]
    c10d_logger._c10d_logger.addHandler(handler)
    errors = []
    try:
        x = torch.ones(1)
        for _ in range(4):
            try:
                wrapper(x)
            except ValueError as exc:
                errors.append(exc)
    finally:
        c10d_logger._c10d_logger.removeHandler(handler)
    assert callers[0] == "wrapper" and callers[2:] == ["guarded", "guarded"]  # the first: `before`'s path
    assert [str(e) for e in errors] == ["made-up failure"] and len(logged) == 1
    message = logged[0].msg
    assert isinstance(message, dict)
    assert (message["func_name"], message["error"]) == ("made_up_reduce", "made-up failure")
    frames = [frame.f_code.co_name for frame, _ in traceback_frames(errors[0])]
    assert "again" not in frames and frames[-1] == "made_up_reduce"
    assert guard.current_runtime().ring.recent()[-1].state == "failed"


def traceback_frames(error: BaseException) -> list:
    import traceback

    return list(traceback.walk_tb(error.__traceback__))


def test_a_line_called_again_with_other_arguments_gets_their_signature(one_rank: None) -> None:
    """The hot path reuses a line's last signature (its plan) only for the same call again: another shape,
    dtype or reduce op from the same line is described anew, and the same call after it reuses that."""
    guard.install()
    runtime = guard.current_runtime()
    int64 = torch.int64
    calls: list[tuple[torch.Tensor, dict]] = [
        (torch.ones(2), {}), (torch.ones(2), {}), (torch.ones(3), {}), (torch.ones(3, dtype=int64), {}),
        (torch.ones(3, dtype=int64), {"op": dist.ReduceOp.MAX}),
        (torch.ones(3, dtype=int64), {"op": dist.ReduceOp.MAX}),
        (torch.nn.Parameter(torch.ones(3), requires_grad=False), {}),
    ]
    for tensor, kwargs in calls:
        dist.all_reduce(tensor, **kwargs)  # marker:plan
    recorded = [fp.signature for fp in runtime.ring.recent()[-len(calls):]]
    assert [(s.shapes, s.dtypes, s.reduce_op) for s in recorded] == [
        ([[2]], ["float32"], "SUM"), ([[2]], ["float32"], "SUM"), ([[3]], ["float32"], "SUM"),
        ([[3]], ["int64"], "SUM"), ([[3]], ["int64"], "MAX"), ([[3]], ["int64"], "MAX"),
        ([[3]], ["float32"], "SUM"),
    ]
    assert recorded[0] is recorded[1] and recorded[4] is recorded[5]
    assert {s.site.line for s in recorded} == {line_of("marker:plan")}


@pytest.mark.parametrize("one_rank", ["cuda:gloo"], indirect=True)
def test_remedy_performs_the_collective(one_rank: None, capsys: pytest.CaptureFixture[str]) -> None:
    guard.install(remedy=True)
    values = torch.tensor([1.0, 2.0])
    for _ in range(3):
        dist.all_reduce(values)
    assert values.tolist() == [1.0, 2.0]  # one rank: the sum is the value itself
    assert capsys.readouterr().err.count("[ddpdoctor] remedy:") == 1


def test_install_before_torch_is_imported_waits_for_it() -> None:
    code = (
        "import sys, ddpdoctor\n"
        "ddpdoctor.install()\n"
        "assert 'torch' not in sys.modules, 'install imported torch'\n"
        "import torch.distributed as dist\n"
        "from torch.distributed import broadcast\n"
        "assert hasattr(dist.all_reduce, '__ddpdoctor_original__')\n"
        "assert hasattr(broadcast, '__ddpdoctor_original__')\n"
        "print('ok')\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=job_env()
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_guard_bug_fails_open(one_rank: None, capsys: pytest.CaptureFixture[str]) -> None:
    guard.install()
    runtime = guard.current_runtime()
    runtime.groups.clear()
    runtime.info = None  # a broken guard: the next call cannot look its group up
    x = torch.ones(2)
    dist.all_reduce(x)
    dist.all_reduce(x)
    assert runtime.disabled
    assert capsys.readouterr().err.count("the guard disabled itself") == 1

