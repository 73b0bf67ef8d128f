"""Where a collective came from: the user's frame, cached per code object and instruction."""

from __future__ import annotations

from ddpdoctor.guard.callsite import call_sites, classify


def test_two_calls_on_one_line_and_calls_on_different_lines_get_their_own_lines() -> None:
    def issue() -> tuple:
        return call_sites(2)

    first = issue(); second = issue()  # noqa: E702 - two call sites on one line on purpose
    third = issue()
    assert first[0] is not None and second[0] is not None and third[0] is not None
    assert first[0].line == second[0].line == third[0].line - 1
    assert first[0].path == __file__ and first[0].function == "test_two_calls_on_one_line_and_calls_on_different_lines_get_their_own_lines"


def test_code_objects_made_and_freed_at_run_time_are_never_confused() -> None:
    """Sites are cached by the code's id. Functions compiled and dropped in a loop (exec, notebooks) reuse
    memory; each must still be reported with its own file and line."""
    seen = []
    for n in range(200):
        namespace: dict = {"call_sites": call_sites}
        source = "\n" * n + "def issue():\n    return call_sites(1)\n"
        exec(compile(source, f"generated-{n}.py", "exec"), namespace)
        site, _ = namespace["issue"]()
        seen.append((site.path, site.line))
        del namespace
    assert seen == [(f"generated-{n}.py", n + 2) for n in range(200)]


def test_torch_distributed_subsystems_are_named_and_other_torch_frames_are_plain_torch() -> None:
    """A report names the library frame that issued a collective, except plain `torch` frames (a
    decorator's wrapper); FSDP's, DDP's and checkpointing's own frames say which part of torch made it."""
    import lightning.pytorch.trainer.trainer as trainer
    import torch.distributed.checkpoint.state_dict_saver as saver
    import torch.distributed.fsdp._fully_shard._fsdp_collectives as fsdp_collectives
    import torch.nn.parallel.distributed as ddp
    import torch.utils._contextlib as contextlib

    assert classify(fsdp_collectives.__file__)[1] == "torch.distributed.fsdp"
    assert classify(saver.__file__)[1] == "torch.distributed.checkpoint"
    assert classify(ddp.__file__)[1] == "torch.nn.parallel"
    assert classify(contextlib.__file__)[1] == "torch"
    assert classify(trainer.__file__)[1] == "lightning"
