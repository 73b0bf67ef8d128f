"""`ddpdoctor run`: run a training command under the runtime guard (no code changes)."""

from __future__ import annotations

import argparse

DESCRIPTION = """\
Run COMMAND with the ddpdoctor guard active in every Python process it starts: torchrun workers,
the DDP workers Lightning re-launches, mp.spawn children. Everything after `--` is passed unchanged.

The guard records each collective (op, shapes, dtypes, call site) in memory, checks tensor devices
against the group's backends before each call, and compares ranks through the job's rendezvous store
when one waits too long. On a divergence, a dead rank or a hang it prints one report for the whole
job and stops every rank instead of waiting for the backend timeout.

examples:
  ddpdoctor run -- torchrun --nproc-per-node 2 train.py
  ddpdoctor run --hang-after 60 --report out/ -- python train_lightning.py

At the end of the job a short summary lists every finding (report.json has them all): the guard's
and the audits' (a DistributedSampler whose epoch never moves, a shuffling loader that does not shard,
a loader generator on an accelerator), each with the ranks that found it.

exit codes: 0 clean run (warnings only, unless --strict), 1 the guard found an error (with --strict:
any finding), otherwise the command's own exit code"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--hang-after",
        type=float,
        default=300.0,
        metavar="SECONDS",
        help="report a rank that waits this long in a collective while peers are stuck elsewhere (default "
        "300); a peer that is running (its stack moves) is slow, not stuck: see --slow-after",
    )
    parser.add_argument(
        "--slow-after",
        type=float,
        default=None,
        metavar="SECONDS",
        help="note a rank that has run alone this long (its stack moves, it is in no collective) while its "
        "peers wait in one; such a rank is slow, not stuck, and is never stopped (default 60, or "
        "--hang-after where lower)",
    )
    parser.add_argument(
        "--digest-every",
        type=float,
        default=None,
        metavar="SECONDS",
        help="compare the parameters of data-parallel replicas (DDP) every SECONDS as well as at checkpoint "
        "saves and at the end of the job (default 300; 0: not on the clock)",
    )
    parser.add_argument("--report", metavar="DIR", help="write report.json and each job's rank logs "
                        "(job-<n>/rank-<r>.jsonl) into DIR")
    parser.add_argument(
        "--remedy",
        action="store_true",
        help="run collectives whose tensors sit on a device the group has no backend for on a supported "
        "device instead of failing (warns once per call site)",
    )
    parser.add_argument(
        "--strict",
        action="store_true",
        help="exit 1 when the run has any finding, a warning too (by default warnings, such as the audits' "
        "sampler and loader findings, leave the exit code alone)",
    )
    parser.add_argument(
        "--stop-always",
        action="store_true",
        help="stop the job on every failure found, also where the program handles it: a rank waiting in "
        "monitored_barrier, or a collective whose error the program catches (by default those are "
        "reported and the program gets torch's error)",
    )
    parser.add_argument(
        "--heartbeat", type=float, default=0.5, metavar="SECONDS", help="monitor heartbeat (default 0.5)"
    )
    parser.add_argument("command", nargs=argparse.REMAINDER, metavar="-- COMMAND", help="the command to run")


def run(args: argparse.Namespace) -> int:
    import os

    from ..errors import UsageError
    from ..guard.launch.launcher import RunOptions, launch

    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise UsageError("no command given; usage: ddpdoctor run [OPTIONS] -- COMMAND ...")
    if not args.hang_after > 0:  # written so that nan fails too
        raise UsageError("--hang-after must be a positive number of seconds")
    if args.slow_after is not None and not args.slow_after > 0:
        raise UsageError("--slow-after must be a positive number of seconds")
    if not 0 < args.heartbeat <= 60:
        raise UsageError("--heartbeat must be between 0 and 60 seconds")
    from ..guard.config import ENV_DIGEST_INTERVAL  # from the settings, not the audits: the job starts sooner

    # read by every rank (replica_points.py); this run's flag only, not what an enclosing run left
    os.environ.pop(ENV_DIGEST_INTERVAL, None)
    if args.digest_every is not None:
        if not args.digest_every >= 0:
            raise UsageError("--digest-every must be a number of seconds (0: not on the clock)")
        os.environ[ENV_DIGEST_INTERVAL] = f"{args.digest_every:g}"
    report_dir = os.path.abspath(args.report) if args.report else None
    return launch(
        RunOptions(
            command=command,
            hang_after=args.hang_after,
            report_dir=report_dir,
            remedy=args.remedy,
            heartbeat=args.heartbeat,
            strict=args.strict,
            stop_always=args.stop_always,
            slow_after=args.slow_after,
        )
    )
