"""`ddpdoctor run` as a launcher: usage errors, exit codes, and nothing of the job left running."""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from guard_jobs import DDPDOCTOR, FIXTURES, PYTHON, job_env, run_job, torchrun
from processes import kill_session

import ddpdoctor
from ddpdoctor.demo.manifest import aborted_in_teardown
from ddpdoctor.findings import Finding, Severity
from ddpdoctor.guard.host import pid_alive, process_stopped, this_host, zombie_status
from ddpdoctor.guard.launch.conclusion import conclude
from ddpdoctor.guard.launch.launcher import RankDeaths, RunOptions
from ddpdoctor.guard.protocol import Mark
from ddpdoctor.guard.report import write_report


def test_no_command_is_a_usage_error() -> None:
    result = run_job([*DDPDOCTOR, "run"], timeout=30)
    assert result.returncode == 2
    assert "no command given" in result.output and "Traceback" not in result.output


def test_missing_program_is_one_line() -> None:
    result = run_job([*DDPDOCTOR, "run", "--", "/nonexistent/trainer"], timeout=30)
    assert result.returncode == 127
    assert "cannot start '/nonexistent/trainer'" in result.output and "Traceback" not in result.output


def test_exit_code_of_a_command_without_findings_is_passed_through() -> None:
    result = run_job([*DDPDOCTOR, "run", "--", PYTHON, "-c", "import sys; sys.exit(3)"], timeout=30)
    assert result.returncode == 3


def test_arguments_after_the_separator_are_passed_unchanged() -> None:
    code = "import sys; print(sys.argv[1:])"
    result = run_job([*DDPDOCTOR, "run", "--", PYTHON, "-c", code, "--report", "x y", "--"], timeout=30)
    assert result.returncode == 0
    assert "['--report', 'x y', '--']" in result.output


def test_background_children_do_not_outlive_the_job(tmp_path: Path) -> None:
    pid_file = tmp_path / "child.pid"
    code = (
        "import subprocess, sys\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
        f"open({str(pid_file)!r}, 'w').write(str(child.pid))\n"
        "sys.exit(1)\n"
    )
    result = run_job([*DDPDOCTOR, "run", "--", PYTHON, "-c", code], timeout=60)
    assert result.returncode == 1
    pid = int(pid_file.read_text())
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    raise AssertionError(f"child {pid} of the job is still running")


def _ranks(run_dir: Path) -> list[subprocess.Popen]:
    """Two long-running processes, with the meta files a guarded rank leaves in the run directory."""
    ranks = [subprocess.Popen([PYTHON, "-c", "import time; time.sleep(60)"]) for _ in range(2)]
    for rank, proc in enumerate(ranks):
        meta = {"rank": rank, "pid": proc.pid, "host": this_host(), "world_size": 2}
        (run_dir / f"rank-{rank}.meta.json").write_text(json.dumps(meta))
    return ranks


@pytest.mark.parametrize("pidfd", [True, False], ids=["pidfd", "polling"])
def test_rank_deaths_names_the_rank_that_died_before_the_launcher_stopped_the_other(
    tmp_path: Path, pidfd: bool
) -> None:
    """What torchrun does after an OOM kill: rank 1 gets SIGKILL, rank 0 a SIGTERM a tenth of a second
    later."""
    ranks = _ranks(tmp_path)
    main = subprocess.Popen([PYTHON, "-c", "import time; time.sleep(1.5)"])
    try:
        deaths = RankDeaths(str(tmp_path))
        if not pidfd:
            deaths._poller = None

        def torchrun_after_an_oom_kill() -> None:
            time.sleep(0.5)
            ranks[1].send_signal(signal.SIGKILL)
            time.sleep(0.1)
            ranks[0].send_signal(signal.SIGTERM)

        killer = threading.Thread(target=torchrun_after_an_oom_kill)
        killer.start()
        assert deaths.wait(main) == 0
        killer.join()
        assert deaths.first() == {1}
        assert set(deaths.gone_at) == {0, 1} and deaths.gone_at[1] < deaths.gone_at[0]
        # read while they were zombies (reaped only below): what each was ended by
        assert deaths.status == {1: signal.SIGKILL, 0: signal.SIGTERM}
    finally:
        for proc in [*ranks, main]:
            proc.kill()
            proc.wait()


def test_a_rank_gone_with_its_killed_agent_is_not_the_first(tmp_path: Path) -> None:
    """The OOM killer takes torchrun's agent, and a rank ends with it (its store was the agent's): seen in
    one wake-up with the agent, that rank is no rank that took the job down (CI of eaf7c4f and 3076d38:
    `test_workers_whose_torchrun_agent_died_do_not_outlive_the_job` reported it as a dead rank)."""
    ranks = _ranks(tmp_path)
    main = subprocess.Popen([PYTHON, "-c", "import time; time.sleep(30)"])
    try:
        deaths = RankDeaths(str(tmp_path))
        deaths._find_ranks()  # both ranks watched while they run, as the launcher's first scan does
        # both end before the watcher next wakes (a busy machine): one wake-up sees them together
        main.send_signal(signal.SIGKILL)
        ranks[0].send_signal(signal.SIGKILL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not all(
                zombie_status(p.pid) is not None for p in (main, ranks[0])):
            time.sleep(0.01)
        assert deaths.wait(main) == -signal.SIGKILL
        assert 0 in deaths.gone_at and 1 not in deaths.gone_at
        assert deaths.first() == set()
    finally:
        for proc in [*ranks, main]:
            proc.kill()
            proc.wait()


def test_rank_deaths_do_not_order_ranks_stopped_together(tmp_path: Path) -> None:
    """A scheduler's preemption SIGTERMs every rank at once: nobody died first."""
    ranks = _ranks(tmp_path)
    main = subprocess.Popen([PYTHON, "-c", "import time; time.sleep(1.0)"])
    try:
        deaths = RankDeaths(str(tmp_path))
        stopper = threading.Timer(0.4, lambda: [proc.send_signal(signal.SIGTERM) for proc in ranks])
        stopper.start()
        deaths.wait(main)
        stopper.join()
        assert set(deaths.gone_at) == {0, 1}
        assert deaths.first() == set()
    finally:
        for proc in [*ranks, main]:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("printed", [False, True], ids=["stopped-before-printing", "printed"])
def test_the_report_is_printed_once_even_if_its_rank_was_stopped_while_printing(
    tmp_path: Path, capsys, printed: bool
) -> None:
    """The deciding rank writes the report's files, marks them, prints, marks that: torchrun may SIGTERM it
    in between (the other rank died of gloo's abort), and then `ddpdoctor run` prints it, but never twice."""
    finding = Finding(
        class_="collective-divergence",
        message="shape mismatch: rank 0 [3] vs rank 1 [5]",
        severity=Severity.ERROR,
    )
    write_report(str(tmp_path), [finding])
    (tmp_path / Mark.REPORTED.value).write_text("1")
    if printed:
        (tmp_path / Mark.PRINTED.value).write_text("1")
    assert conclude(RunOptions(command=["train"]), str(tmp_path), 1) == 1
    shown = capsys.readouterr().err
    assert shown.count("shape mismatch: rank 0 [3] vs rank 1 [5]") == (0 if printed else 1)


def test_a_sigterm_during_the_report_waits_for_it_and_then_stops_the_rank(tmp_path: Path) -> None:
    """torchrun's SIGTERM arriving while the deciding rank prints and marks its report is taken after the
    block: the report and its mark are complete, and the rank still ends as SIGTERM ends it."""
    script = tmp_path / "rank.py"
    script.write_text(
        "import os, signal, sys, time\n"
        "from ddpdoctor.guard.rank.publish import sigterm_deferred\n"
        "with sigterm_deferred():\n"
        "    os.kill(os.getpid(), signal.SIGTERM)\n"
        "    time.sleep(0.2)\n"
        "    print('report printed and marked', flush=True)\n"
        "print('went on after the SIGTERM', flush=True)\n"
    )
    done = subprocess.run([PYTHON, str(script)], capture_output=True, text=True, timeout=30)
    assert done.stdout == "report printed and marked\n", done.stderr
    assert done.returncode == -signal.SIGTERM


def _start_steady_job(tmp_path: Path, mode: str, prefix: tuple[str, ...] = (),
                      options: tuple[str, ...] = ()) -> tuple[subprocess.Popen, list[int]]:
    """`ddpdoctor run -- torchrun ... steady.py`, returned once both ranks are inside their loop. The job
    starts with the default dispositions of the signals the tests send it, whatever pytest inherited
    (`nohup pytest` ignores SIGHUP, and `ddpdoctor run` keeps an inherited SIG_IGN on purpose)."""
    command = [*prefix, *DDPDOCTOR, "run", *options, "--", *torchrun("steady.py", str(tmp_path), mode)]
    job = subprocess.Popen(
        command,
        env=job_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    deadline = time.monotonic() + 60
    while len(list(tmp_path.glob("rank-*.pid"))) < 2:
        if time.monotonic() > deadline or job.poll() is not None:
            kill_session(job.pid)
            raise AssertionError("the job did not start: " + (job.communicate(timeout=10)[0] or "")[-2000:])
        time.sleep(0.1)
    time.sleep(0.3)  # the pid files are written before the rest of a step
    return job, [int(p.read_text()) for p in tmp_path.glob("rank-*.pid")]


def _finish(job: subprocess.Popen, ranks: list[int]) -> tuple[str, list[int]]:
    """The job's output and the ranks still alive once `ddpdoctor run` returned (then killed, also when it
    did not return in time)."""
    try:
        output = job.communicate(timeout=60)[0]
    finally:
        kill_session(job.pid)
        alive = [pid for pid in ranks if pid_alive(pid)]
        for pid in alive:
            os.kill(pid, signal.SIGKILL)
    return output, alive


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGHUP], ids=["SIGINT", "SIGHUP"])
def test_stopping_ddpdoctor_run_stops_a_healthy_job_without_a_false_report(
    tmp_path: Path, signum: int
) -> None:
    """Ctrl-C or a closed terminal: the job is stopped, and the ranks it stopped are not reported as dead
    ranks (they died because they were told to). A scheduler's SIGTERM: the nohup test below ends its job
    so, with the same assertions (one job for both)."""
    job, ranks = _start_steady_job(tmp_path, "loop")
    job.send_signal(signum)
    output, alive = _finish(job, ranks)
    assert job.returncode != 0
    assert "dead-rank" not in output and "ddpdoctor: " not in output, output[-3000:]
    assert alive == [], f"ranks {alive} outlived the job"


def test_under_nohup_a_closed_terminal_does_not_stop_the_job_and_sigterm_does(tmp_path: Path) -> None:
    """nohup starts ddpdoctor with SIGHUP ignored: it must stay ignored, not be forwarded to the job. Then a
    scheduler's SIGTERM stops the healthy job, and the ranks it stopped are not reported as dead ranks."""
    job, ranks = _start_steady_job(tmp_path, "loop", prefix=(shutil.which("nohup") or "nohup",))
    job.send_signal(signal.SIGHUP)
    time.sleep(2)
    running = job.poll() is None and all(pid_alive(pid) for pid in ranks)
    job.send_signal(signal.SIGTERM)
    output, alive = _finish(job, ranks)
    assert running, output[-3000:]
    assert job.returncode != 0
    assert "dead-rank" not in output and "ddpdoctor: " not in output, output[-3000:]
    assert alive == [], f"ranks {alive} outlived the job"


def _can_be_pid_1() -> bool:
    try:
        return subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "true"], capture_output=True,
                              timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@pytest.mark.skipif(not _can_be_pid_1(), reason="needs `unshare --pid` (root or user namespaces)")
def test_as_pid_1_an_exited_orphan_does_not_hold_up_the_end_of_a_clean_job() -> None:
    """`docker run IMAGE ddpdoctor run -- ...` without an init: the orphan's zombie is ours to reap, or it
    counts as a live member of the job and a clean job ends only after the 5 s linger."""
    result = run_job(["unshare", "--pid", "--fork", "--mount-proc", *DDPDOCTOR, "run", "--", PYTHON,
                      str(FIXTURES / "leaves_orphan.py")], timeout=30)
    ended = time.time()
    assert result.returncode == 0 and "main done" in result.output, result.output
    # from the job's main process being done, not from the start (start-up is slow under load)
    done = float(re.search(r"main done at (\d+\.\d+)", result.output).group(1))
    assert ended - done < 4, f"{ended - done:.1f} s: the exited orphan held the job until the linger ran out"


def test_ctrl_backslash_stops_the_job_too(tmp_path: Path) -> None:
    """SIGQUIT (Ctrl-\\) would kill ddpdoctor and leave the job, in a session of its own, running."""
    job, ranks = _start_steady_job(tmp_path, "loop")
    job.send_signal(signal.SIGQUIT)
    output, alive = _finish(job, ranks)
    assert job.returncode != 0
    assert alive == [], f"ranks {alive} outlived the job"
    assert "dead-rank" not in output and "ddpdoctor: " not in output, output[-3000:]


def _until(condition, seconds: float = 10) -> bool:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_ctrl_z_suspends_the_whole_job_and_fg_continues_it(tmp_path: Path) -> None:
    """The job runs in a session of its own: the terminal's SIGTSTP reaches only ddpdoctor, which
    would stop alone and leave the ranks running (and printing) in the background."""
    job, ranks = _start_steady_job(tmp_path, "loop")
    job.send_signal(signal.SIGTSTP)
    suspended = _until(lambda: process_stopped(job.pid) and all(process_stopped(pid) for pid in ranks))
    job.send_signal(signal.SIGCONT)
    resumed = _until(lambda: not process_stopped(job.pid) and not any(process_stopped(pid) for pid in ranks))
    job.send_signal(signal.SIGTERM)
    output, alive = _finish(job, ranks)
    assert suspended and resumed, output[-3000:]
    assert alive == [] and "ddpdoctor: " not in output, output[-3000:]


def test_a_ctrl_z_longer_than_hang_after_is_not_counted_as_waiting(tmp_path: Path) -> None:
    """Rank 0 waits in an all_reduce while rank 1 is busy elsewhere for 2.5 s, under --hang-after 3; the
    job is stopped for 5 s in the middle. The monotonic clock ran on while nothing ran: counted as
    waiting, rank 0 had 'waited' past --hang-after the moment the job was continued, and a healthy job
    was killed as a hang."""
    job, ranks = _start_steady_job(tmp_path, "slow-peer", options=("--hang-after", "3"))
    time.sleep(1.0)  # past the grace period: rank 0 is already suspicious when the job is stopped
    job.send_signal(signal.SIGTSTP)
    suspended = _until(lambda: process_stopped(job.pid) and all(process_stopped(pid) for pid in ranks))
    time.sleep(5)
    job.send_signal(signal.SIGCONT)
    output, alive = _finish(job, ranks)
    assert suspended, output[-3000:]
    assert "ddpdoctor: " not in output, output[-3000:]
    assert "rank 0: done" in output and "rank 1: done" in output, output[-3000:]
    assert job.returncode == 0 or aborted_in_teardown(job.returncode, output, "rank 1: done"), output[-3000:]
    assert alive == []


def test_workers_whose_torchrun_agent_died_do_not_outlive_the_job(tmp_path: Path) -> None:
    """torchrun starts each worker in a session of its own: when the agent is killed (OOM killer), its
    workers run on, in no process group of the launcher's."""
    job, ranks = _start_steady_job(tmp_path, "orphan")
    output, alive = _finish(job, ranks)
    # the command's own end, as the shell would give it (once in ~20 CI runs this was 1: a report; the
    # output says which)
    assert job.returncode == 128 + signal.SIGKILL, output[-4000:]
    assert alive == [], f"ranks {alive} outlived the job"
    # the ranks were stopped by ddpdoctor itself once their agent was gone: none of them is to blame
    assert "ddpdoctor: dead-rank" not in output, output[-3000:]


def test_an_unwritable_report_dir_is_a_usage_error_before_the_job_runs(tmp_path: Path) -> None:
    occupied = tmp_path / "report"
    occupied.write_text("a file, not a directory")
    marker = tmp_path / "ran"
    result = run_job([*DDPDOCTOR, "run", "--report", str(occupied), "--", PYTHON, "-c",
                      f"open({str(marker)!r}, 'w')"], timeout=30)
    assert result.returncode == 2
    assert f"--report {occupied}: cannot write there" in result.output and "Traceback" not in result.output
    assert not marker.exists()


def test_a_reused_report_dir_shows_this_run_only(tmp_path: Path) -> None:
    """A failed run's report.json and rank logs, then a clean run into the same directory: what is there
    afterwards is the clean run's; files that are not ddpdoctor's stay."""
    report = tmp_path / "report"
    report.mkdir()
    (report / "report.json").write_text('[{"class": "dead-rank", "message": "from the last run"}]\n')
    (report / "rank-3.jsonl").write_text('{"rank": 3, "op": "all_reduce"}\n')
    (report / "rank-notes.jsonl").write_text("mine\n")
    (report / "job-1").mkdir()  # a job's folder of the last run: its logs go, and then the folder
    (report / "job-1" / "rank-0.jsonl").write_text('{"rank": 0, "op": "all_reduce"}\n')
    result = run_job([*DDPDOCTOR, "run", "--report", str(report), "--", PYTHON, "-c", "pass"], timeout=30)
    assert result.returncode == 0, result.output
    assert json.loads((report / "report.json").read_text()) == []
    assert sorted(p.name for p in report.iterdir()) == ["rank-notes.jsonl", "report.json"]


def test_a_command_that_cannot_start_exits_as_a_shell_would(tmp_path: Path) -> None:
    """127: not found; 126: found but not executable; a script whose #! interpreter is missing is named
    for that, not as a missing file."""
    missing = run_job([*DDPDOCTOR, "run", "--", "no-such-command-here"], timeout=30)
    assert missing.returncode == 127 and "cannot start 'no-such-command-here'" in missing.output
    script = tmp_path / "train.py"
    script.write_text("#!/no/such/python\nprint('hi')\n")
    not_executable = run_job([*DDPDOCTOR, "run", "--", str(script)], timeout=30)
    assert not_executable.returncode == 126, not_executable.output
    script.chmod(0o755)
    no_interpreter = run_job([*DDPDOCTOR, "run", "--", str(script)], timeout=30)
    assert no_interpreter.returncode == 127
    assert "its interpreter '/no/such/python' (the #! line) was not found" in no_interpreter.output
    assert "Traceback" not in missing.output + not_executable.output + no_interpreter.output


def test_a_python_script_given_as_the_command_is_answered_with_the_command_to_use(tmp_path: Path) -> None:
    """`ddpdoctor run train.py` (or `-- train.py`): the file is there, but it is no command; the answer says
    how to run it, not "No such file or directory" about a file the user can see."""
    (tmp_path / "train.py").write_text("print('hi')\n")
    for command in (["train.py"], ["--", "train.py"], ["--", "./train.py"]):
        result = run_job([*DDPDOCTOR, "run", *command], timeout=30, cwd=str(tmp_path))
        assert result.returncode in (126, 127), result.output
        program = command[-1]
        assert f"cannot start '{program}'" in result.output
        assert f"`ddpdoctor run -- python {program}`" in result.output, result.output
    assert "no such command (a file of that name is here" in run_job(
        [*DDPDOCTOR, "run", "train.py"], timeout=30, cwd=str(tmp_path)).output


@pytest.mark.parametrize("flags", ["-I", "-E", "-uS"])
def test_a_python_that_cannot_load_the_guard_is_named(flags: str) -> None:
    """`python -I`, `-E` and `-S` skip PYTHONPATH or site, so the guard never loads: a silent exit 0 would
    read as a checked run."""
    result = run_job([*DDPDOCTOR, "run", "--", PYTHON, flags, "-c", "print('ran')"], timeout=30)
    assert result.returncode == 0 and "ran" in result.output
    assert f"`python -{flags[-1]}` does not load the guard" in result.output
    plain = run_job([*DDPDOCTOR, "run", "--", PYTHON, "-u", "-c", "print('ran')"], timeout=30)
    assert "does not load the guard" not in plain.output


def _older_pythons() -> list[str]:
    """Interpreters older than the guard supports, where pyenv has left some (Python 2 among them)."""
    found = []
    for python in sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/*/bin/python"))):
        version = tuple(int(p) for p in Path(python).parent.parent.name.split(".")[:2] if p.isdigit())
        if len(version) == 2 and version < (3, 10):
            found.append(python)
    return found


@pytest.mark.skipif(not _older_pythons(), reason="no interpreter older than 3.10 on this machine")
def test_an_older_python_the_job_starts_runs_untouched_and_silent() -> None:
    """A tool in Python 2 or 3.8 that the job runs also reads the bootstrap's sitecustomize: it must not
    print a failed import or a guard warning into that tool's output."""
    for python in _older_pythons():
        result = subprocess.run([*DDPDOCTOR, "run", "--", python, "-c", "print('ran')"], env=job_env(),
                                capture_output=True, text=True, timeout=60)
        assert (result.returncode, result.stdout, result.stderr) == (0, "ran\n", ""), python


@pytest.mark.parametrize("option", ["--hang-after", "--heartbeat", "--slow-after", "--digest-every"])
def test_nan_is_not_a_number_of_seconds(option: str) -> None:
    result = run_job([*DDPDOCTOR, "run", option, "nan", "--", PYTHON, "-c", "pass"], timeout=30)
    assert result.returncode == 2 and option in result.output


def test_the_job_sees_its_environment_as_without_the_guard(tmp_path: Path) -> None:
    """An empty PYTHONPATH entry (`:$HOME/lib`) keeps the working directory importable; options left in
    the environment by an enclosing run are not this run's; the user's own sitecustomize is imported
    and stays `sitecustomize`."""
    (tmp_path / "local_module.py").write_text("VALUE = 'from the working directory'\n")
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("MARK = 42\n")
    code = ("import os, local_module, sitecustomize\n"
            "print(local_module.VALUE, sitecustomize.MARK, os.environ.get('DDPDOCTOR_REMEDY'), "
            "os.environ.get('DDPDOCTOR_REPORT_DIR'))")
    env = job_env(
        PYTHONPATH=f"{os.pathsep}{site}", DDPDOCTOR_REMEDY="1", DDPDOCTOR_REPORT_DIR=str(tmp_path / "old")
    )
    result = run_job([*DDPDOCTOR, "run", "--", PYTHON, "-c", code], timeout=30, env=env, cwd=str(tmp_path))
    assert result.returncode == 0, result.output
    assert "from the working directory 42 None None" in result.output


def test_another_python_gets_the_guard_but_not_the_packages_beside_ddpdoctor(tmp_path: Path) -> None:
    """A job started with an interpreter that does not have ddpdoctor installed: the guard is imported
    from ddpdoctor's install directory (here a site-packages made of a link to the package and one other
    module), and the program does not see that directory's other packages."""
    base = getattr(sys, "_base_executable", None)
    if (
        not base
        or not os.path.exists(base)
        or subprocess.run([base, "-c", "import ddpdoctor"], capture_output=True).returncode == 0
    ):
        pytest.skip("no interpreter without ddpdoctor here")
    site = tmp_path / "site-packages"
    site.mkdir()
    (site / "ddpdoctor").symlink_to(Path(ddpdoctor.__file__).parent)
    (site / "only_beside_ddpdoctor.py").write_text("")
    code = ("import sys\n"
            "print('guard' if 'ddpdoctor.guard' in sys.modules else 'no guard')\n"
            "import only_beside_ddpdoctor\n")
    env = job_env(PYTHONPATH=str(site / "ddpdoctor" / "guard" / "bootstrap"), DDPDOCTOR_GUARD="1")
    done = subprocess.run([base, "-c", code], env=env, capture_output=True, text=True, timeout=30)
    assert done.stdout.strip() == "guard", done.stderr
    assert "No module named 'only_beside_ddpdoctor'" in done.stderr
