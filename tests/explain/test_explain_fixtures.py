"""Every fixture log: the right class comes first, with the facts a user would look for.

The logs under fixtures/ were produced by really running the failing cases here where they reproduce on
a CPU (gloo), and written from the real message texts where they do not (see fixtures/README.md).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ddpdoctor.explain import explain_paths, knowledge_base

FIXTURES = Path(__file__).parent / "fixtures"

# log -> (class that must come first, facts it must carry, text its fix must contain)
CASES: dict[str, tuple[str, dict[str, object], str]] = {
    # the guard's own reports in a log (`ddpdoctor run` output): explain agrees with what the guard decided
    "guard_backend_device_mismatch": ("backend-device-mismatch", {}, "--remedy"),
    "guard_collective_divergence": ("collective-divergence", {}, "same collective"),
    "guard_collective_timeout": ("collective-timeout", {}, "stacks in the report"),
    "guard_dead_rank": ("dead-rank", {}, "dmesg"),  # the SIGKILL in the log refines the fix
    "guard_single_rank_long_section": ("single-rank-long-section", {}, "off the critical path"),
    "guard_replica_divergence": ("replica-divergence", {}, "last micro-batch"),
    "guard_sharded_step_divergence": ("sharded-step-divergence", {}, "synced_gpus=True"),
    # F11 read from NCCL's watchdog: FSDP's hidden collectives, ranks at different positions (sharded.py);
    # at one position, the timeout leads and the sharded reading follows it
    "nccl_fsdp_allgather_positions": ("sharded-step-divergence", {"sharded_ranks": [0]}, "synced_gpus=True"),
    "nccl_fsdp_allgather_same": (
        "collective-timeout", {"op_type": "_REDUCE_SCATTER_BASE"}, "did not enter _REDUCE_SCATTER_BASE #517"
    ),
    # F12 replica-divergence: DDP's own check at the wrap, models built from each rank's data
    "ddp_param_shape_mismatch": (
        "replica-divergence", {"param_index": 2, "other_rank": 0, "sizes": "6, 16"}, "every rank"
    ),
    # F1 backend-device-mismatch
    "f1_cuda_gloo": (
        "backend-device-mismatch",
        {"device_type": "cpu", "op": "all_reduce", "ranks": [0, 1]},
        "cpu:gloo,cuda:nccl",
    ),
    "lightning_f1_sync_dist": (
        "backend-device-mismatch",
        {"device_type": "cpu", "library": "lightning", "user_function": "training_step"},
        "self.device",
    ),
    "lightning_lr_find_then_fit": (
        "backend-device-mismatch",
        {"tuner_ran": True, "fixed_in": "lightning 2.4.0", "op": "all_reduce", "culprit_rank": 1},
        "2.4.0",
    ),
    "sat_cogvlm_broadcast": (
        "backend-device-mismatch",
        {"library": "SwissArmyTransformer", "broken_in": "0.4.10", "fixed_in": "0.4.11", "op": "broadcast"},
        "0.4.11",
    ),
    "tensors_must_be_cuda": (
        "backend-device-mismatch",
        {"user_frame": "./train.py:81"},
        "DDP(model.to(local_rank)",
    ),
    "tensors_must_be_cuda_allreduce": (
        "backend-device-mismatch",
        {"op": "all_reduce", "user_frame": "main.py:446"},
        "all_reduce",
    ),
    "lightning_rich_tensors_must_be_cuda": (
        "backend-device-mismatch",
        {
            "op": "all_reduce",
            "library_frame": "pytorch_lightning/strategies/ddp.py",
            "user_frame": "/home/user/chatglm_finetuning/train.py:121",
        },
        "all_reduce",
    ),
    # F2 init-module-scope: the generator error and Lightning's follow-up are one diagnosis
    "f2_generator_init_module": (
        "init-module-scope",
        {
            "default_device": "cuda",
            "generator_device": "cpu",
            "default_device_context": True,
            "occurrences": 3,
        },
        "init_module()",
    ),
    "f2_generator_plain": (
        "init-module-scope",
        {"default_device": "cuda", "generator_device": "cpu"},
        "torch.Generator",
    ),
    # F3 foreign-device-hooks
    "accelerate_hooks_device": (
        "foreign-device-hooks",
        {"device_a": "cuda:1", "device_b": "cuda:0", "ranks": [1], "argument": "index"},
        'device_map={"": local_rank}',
    ),
    "f3_device_plain": ("foreign-device-hooks", {"device_a": "cuda:0", "device_b": "cuda:1"}, "one owner"),
    # F4 collective-divergence
    "f4_detail_mismatch": (
        "collective-divergence",
        {"op_a": "ALLREDUCE", "op_b": "BROADCAST", "rank_a": 0, "rank_b": 1, "seq_num": 0, "shape_a": 3},
        "ALLREDUCE [3] vs BROADCAST [3]",
    ),
    "f4_shape_mismatch": (
        "collective-divergence",
        {"received_bytes": 8, "expected_bytes": 4, "culprit_rank": 0},
        "same shape",
    ),
    "lightning_f4_rank_zero_log": ("collective-divergence", {"ranks": [0]}, "rank_zero_only=True"),
    # the same hang ended by gloo's timeout: rank 1's "Application timeout caused pair closure" is a victim's
    # timeout, not an ordinary exception that killed the job
    "lightning_f4_pair_closure": ("collective-divergence", {"op": "barrier"}, "rank_zero_only=True"),
    # ... and with the roles of the two messages swapped: the rank inside the sync times out first
    "lightning_f4_sync_timeout": (
        "collective-divergence",
        {"op": "barrier", "ranks": [0]},
        "rank_zero_only=True",
    ),
    # F6 dead-rank: a rank that aborted in torch's exit-time cleanup after its script finished
    "teardown_abort": ("dead-rank", {"culprit_rank": 1, "dead_signal": "SIGABRT"}, "destroy_process_group"),
    # F6 collective-timeout: the reporting ranks are victims, the silent ones are named
    "f6_gloo_timeout": (
        "collective-timeout",
        {"timeout_ms": 3000, "reporting_ranks": [0], "silent_ranks": [1], "op": "all_reduce"},
        "rank(s) 1",
    ),
    "nccl_watchdog_new": (
        "collective-timeout",
        {
            "seq_num": 808,
            "op_type": "ALLREDUCE",
            "timeout_ms": 600000,
            "reporting_ranks": [0, 2, 3],
            "silent_ranks": [1],
        },
        "ALLREDUCE #808",
    ),
    "nccl_watchdog_old": (
        "collective-timeout",
        {
            "seq_num": 469508,
            "timeout_ms": 1800000,
            "reporting_ranks": [0, 1, 2, 3, 5, 6, 7],
            "silent_ranks": [4],
        },
        "rank(s) 4",
    ),
    "nccl_watchdog_oldest": (
        "collective-timeout",
        {"op_type": "BROADCAST", "ran_for_ms": 1803170, "reporting_ranks": [1]},
        "BROADCAST",
    ),
    "nccl_watchdog_stuck": ("collective-timeout", {"stuck_seconds": 480, "reporting_ranks": [0, 1]}, ""),
    "f6_init_store_wait": (
        "collective-timeout",
        {"timeout_ms": 10000, "store_keys": "/default_pg/0//cpu//0/0"},
        "as many ranks as world_size",
    ),
    "store_barrier_timeout": (
        "collective-timeout",
        {"world_size": 2, "joined": 1, "silent_ranks": [1]},
        "init_process_group",
    ),
    # F6 dead-rank: which rank died first, how
    "f6_sigkill": (
        "dead-rank",
        {"culprit_rank": 1, "dead_signal": "SIGKILL", "victim_ranks": [0], "exitcode": -9},
        "dmesg",
    ),
    "f6_sigsegv": (
        "dead-rank",
        {"culprit_rank": 1, "dead_signal": "SIGSEGV", "victim_ranks": [0]},
        "PYTHONFAULTHANDLER",
    ),
    # with PYTHONFAULTHANDLER=1 the log holds the crashing rank's Python stack: the fix names the line
    "f6_sigsegv_faulthandler": (
        "dead-rank",
        {
            "culprit_rank": 1,
            "dead_signal": "SIGSEGV",
            "crash_signal": "SIGSEGV",
            "crash_function": "<module>",
        },
        "f6_sigsegv.py:12 (`<module>`",
    ),
    "f6_sigsegv_faulthandler_tee": (
        "dead-rank",
        {
            "culprit_rank": 1,
            "dead_signal": "SIGSEGV",
            "crash_signal": "SIGSEGV",
            "crash_function": "<module>",
        },
        "f6_sigsegv.py:12 (`<module>`",
    ),
    "spawn_sigkill": ("dead-rank", {"culprit_rank": 1, "dead_signal": "SIGKILL"}, "Rank 1 was killed"),
    "f6_rank_exception": (
        "dead-rank",
        {"culprit_rank": 1, "exception": "KeyError", "error": "KeyError: 'sample_17'", "victim_ranks": [0]},
        "Fix the `KeyError` on rank 1",
    ),
    "cuda_oom_rank": (
        "dead-rank",
        {"culprit_rank": 2, "tried_to_allocate": "2.00 GiB", "first_failed_rank": 2},
        "rank 2",
    ),
    "deepspeed_sigkill": (
        "dead-rank",
        {"culprit_rank": 1, "signal_number": 9},
        "Rank 1 was killed (SIGKILL)",
    ),
    # F8 unused-parameters, every wording
    "f8_unused": ("unused-parameters", {"parameter_indices": "2 3", "ranks": [0, 1]}, "indices 2 3"),
    "f8_unused_detail": (
        "unused-parameters",
        {"parameter_names": "unused_head.bias, unused_head.weight"},
        "unused_head.bias",
    ),
    "f8_unused_old_wording": ("unused-parameters", {}, "find_unused_parameters=True"),
    "lightning_f8_unused": ("unused-parameters", {"ranks": [0, 1]}, "ddp_find_unused_parameters_true"),
    "f8_marked_ready_twice": (
        "unused-parameters",
        {"twice_name": "model.layers.3.mlp.down_proj.weight"},
        "use_reentrant=False",
    ),
    # gloo's abort dumped by the fault handler: still the mismatch first, at the line of the collective
    "f4_shape_mismatch_faulthandler": (
        "collective-divergence",
        {"culprit_rank": 0, "crash_signal": "SIGABRT", "user_function": "<module>"},
        "same shape",
    ),
    # F9 process-group-missing, as ValueError (torch >= 2.2) and RuntimeError
    "f9_no_init": (
        "process-group-missing",
        {"exception": "ValueError", "user_function": "<module>"},
        "init_process_group",
    ),
    "f9_runtimeerror": (
        "process-group-missing",
        {"exception": "RuntimeError", "user_frame": "train.py:45"},
        "train.py:45",
    ),
    "f9_env_missing": ("process-group-missing", {"missing_variable": "RANK"}, "torchrun"),
    # F9: init_process_group retrying a store nobody listens on, until the group's timeout
    "f9_store_port_0": (
        "process-group-missing",
        {"store_host": "127.0.0.1", "store_port": 0},
        "--standalone",
    ),
    "f9_rendezvous_timeout": ("process-group-missing", {}, "--rdzv-endpoint"),
    "f9_store_unreachable": (
        "process-group-missing",
        {"store_host": "127.0.0.1", "store_port": 1},
        "MASTER_ADDR",
    ),
    # a job that started and then stopped with no error in it (test_explain_stopped.py reads them closer)
    "hang_torchrun_timeout": (
        "collective-timeout",
        {"ending": "stopped", "stopped_by": "SIGTERM"},
        "ddpdoctor run --hang-after 60 -- torchrun",
    ),
    "hang_torchrun_traced": (
        "collective-timeout",
        {"ending": "stopped", "script": "hang_torchrun.py"},
        "`ddpdoctor check .` in the project of `hang_torchrun.py`",
    ),
    "hang_torchrun_sigkill": (
        "collective-timeout",
        {"ending": "cut-off", "launcher": "torchrun"},
        "ddpdoctor run --hang-after 60 -- torchrun",
    ),
    "hang_lightning_timeout": (
        "collective-timeout",
        {"ending": "cut-off", "launcher": "Lightning", "ranks": [0, 1]},
        "ddpdoctor run --hang-after 60 -- python",
    ),
    "hang_lightning_oom_killed": (
        "dead-rank",
        {"ending": "killed", "stopped_by": "SIGKILL", "script": "hang_lightning.py"},
        "`ddpdoctor check .` in the project of `hang_lightning.py`",
    ),
    "hang_torchrun_workers_terminated": (
        "collective-timeout",
        {"ending": "stopped", "stopped_by": "SIGTERM", "script": "hang_torchrun.py", "ranks": [0, 1]},
        "`ddpdoctor check .` in the project of `hang_torchrun.py`",
    ),
    "hang_accelerate_timeout": (
        "collective-timeout",
        {"ending": "stopped", "launcher": "accelerate"},
        "ddpdoctor run --hang-after 60 -- accelerate launch",
    ),
    # the user's own strategy.reduce (a real Lightning run): named as such, not as a logged metric
    "lightning_f1_strategy_reduce": (
        "backend-device-mismatch",
        {"strategy_call_direct": "reduce", "user_function": "training_step", "culprit_rank": 1},
        "trainer.strategy.reduce",
    ),
    # the paste stops before torchrun's summary: the agent's one-line report names the killed rank
    "f6_sigkill_agent_only": ("dead-rank", {"culprit_rank": 1, "exitcode": -9, "signal": "SIGKILL"}, "dmesg"),
    # F10: every rank renames the shared staging directory (a real 2-rank run); the losing rank is named
    "checkpoint_rename_race": (
        "checkpoint-race",
        {"culprit_rank": 1, "errno": 2, "exception": "FileNotFoundError",
         "target_path": "/tmp/run/ckpt/checkpoint-100"},
        "global rank 0",
    ),
    # a timeout whose late rank was busy: rank 0 evaluating (a real run, 5 s group timeout) ...
    "slow_rank_eval": (
        "single-rank-long-section",
        {"section": "evaluation", "section_rank": 0, "reporting_ranks": [1], "configured_timeout_s": 5.0},
        "longer timeout",
    ),
    # ... and rank 0 tokenizing a dataset while rank 1 waits in the store (reduced by hand)
    "slow_rank_tokenize": (
        "single-rank-long-section", {"section": "data preparation", "section_rank": 0}, "Prepare the data",
    ),
    # distributed errors outside the catalogue: the first one, its rank and what it means
    "duplicate_gpu": ("distributed-error", {"error": "duplicate-gpu", "rank": 1, "rank_a": 1}, "LOCAL_RANK"),
    "invalid_device_ordinal": (
        "distributed-error", {"error": "invalid-device-ordinal", "rank": 2}, "--nproc-per-node",
    ),
    "local_rank_argument": (  # a real run of `python -m torch.distributed.launch`
        "distributed-error", {"error": "local-rank-argument", "argument": "--local-rank=0", "exitcode": 2},
        "--local_rank",
    ),
}
# logs in which nothing is to be diagnosed (test_explain_stopped.py says what explain answers instead)
NOT_DIAGNOSED = {"lightning_finished"}


def test_every_fixture_log_has_a_case() -> None:
    logs = {p.stem for p in FIXTURES.glob("*.log")}
    assert logs == set(CASES) | NOT_DIAGNOSED


@pytest.mark.parametrize("name", sorted(CASES))
def test_fixture_is_diagnosed_with_its_facts(name: str) -> None:
    expected_class, expected_facts, fix_text = CASES[name]
    explanation = explain_paths([str(FIXTURES / f"{name}.log")])
    assert explanation.diagnoses, f"{name}: nothing diagnosed"
    best = explanation.diagnoses[0].finding
    assert best.class_ == expected_class, [d.finding.class_ for d in explanation.diagnoses]
    for key, value in expected_facts.items():
        assert best.facts.get(key) == value, (
            f"{name}: fact {key} = {best.facts.get(key)!r}, expected {value!r}"
        )
    assert best.fix is not None and fix_text in best.fix.message
    assert best.evidence and all(e.line and e.line > 0 for e in best.evidence)
    confidences = [d.finding.confidence or 0 for d in explanation.diagnoses]
    assert confidences == sorted(confidences, reverse=True)


def test_every_signature_is_exercised_by_a_fixture() -> None:
    """Adding a pattern is a data change plus a fixture: a signature no fixture log triggers is untested."""
    kb = knowledge_base()
    text = "\n".join(p.read_text(encoding="utf-8", errors="replace") for p in FIXTURES.glob("*.log"))
    unmatched = [f"{s.slug}/{s.id}" for s in kb.signatures if not s.pattern.search(text)]
    assert not unmatched


def test_victims_rank_below_the_root() -> None:
    # gloo's size check aborts rank 0 (SIGABRT); rank 1 sees `Connection reset by peer`: the mismatch is the
    # root, the abort and the reset are its consequences.
    explanation = explain_paths([str(FIXTURES / "f4_shape_mismatch.log")])
    classes = [d.finding.class_ for d in explanation.diagnoses]
    assert classes == ["collective-divergence", "dead-rank"]
    dead = explanation.diagnoses[1].finding
    assert (dead.confidence or 0) < (explanation.diagnoses[0].finding.confidence or 0)


def test_nccl_abort_after_timeout_is_not_the_cause() -> None:
    # After the watchdog timeout NCCL takes the process down (SIGABRT): that exit must not outrank the
    # timeout.
    explanation = explain_paths([str(FIXTURES / "nccl_watchdog_new.log")])
    assert explanation.diagnoses[0].finding.class_ == "collective-timeout"
    assert (
        explanation.diagnoses[0]
        .explanation[0]
        .startswith("Rank(s) 0, 2, 3 waited 600020 ms in ALLREDUCE #808 (`dist.all_reduce` in Python;")
    )
    assert any("Rank(s) 1 reported no timeout" in s for s in explanation.diagnoses[0].explanation)


def test_the_user_frame_is_the_findings_location() -> None:
    explanation = explain_paths([str(FIXTURES / "f1_cuda_gloo.log")])
    location = explanation.diagnoses[0].finding.location
    assert location is not None
    assert location.path.endswith("generate/f1_cuda_gloo.py") and location.line == 7
    assert location.rank == explanation.diagnoses[0].finding.evidence[0].rank


def test_a_crash_dump_in_the_log_places_the_finding_on_the_line_the_rank_crashed_on() -> None:
    script = (FIXTURES / "generate" / "f6_sigsegv.py").read_text().splitlines()
    crash = next(n for n, line in enumerate(script, 1) if "ctypes.string_at(0)" in line)
    for name in ("f6_sigsegv_faulthandler", "f6_sigsegv_faulthandler_tee"):
        finding = explain_paths([str(FIXTURES / f"{name}.log")]).diagnoses[0].finding
        assert finding.location is not None
        assert finding.location.path.endswith("generate/f6_sigsegv.py") and finding.location.line == crash
        assert finding.facts["crash_frame"].endswith(f"f6_sigsegv.py:{crash}")
        # the stack is there: no advice to rerun for it
        assert finding.fix is not None and "PYTHONFAULTHANDLER" not in finding.fix.message
