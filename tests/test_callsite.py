"""Where a collective came from: the user's frame, cached per code object and instruction."""

from __future__ import annotations

from ddpdoctor.callsite import call_sites, classify, stack_of


def test_two_calls_on_one_line_and_calls_on_different_lines_get_their_own_lines() -> None:
    def issue() -> tuple:
        return call_sites(2)

    first = issue(); second = issue()  # noqa: E702 - two call sites on one line on purpose
    third = issue()
    assert first[0] is not None and second[0] is not None and third[0] is not None
    assert first[0].line == second[0].line == third[0].line - 1
    assert (
        first[0].path == __file__
        and first[0].function == "test_two_calls_on_one_line_and_calls_on_different_lines_get_their_own_lines"
    )


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


def _innermost_frame_of(call) -> object:  # type: ignore[no-untyped-def]
    try:
        call()
    except Exception as exc:  # noqa: BLE001
        traceback = exc.__traceback__
        while traceback.tb_next is not None:
            traceback = traceback.tb_next
        return traceback.tb_frame
    raise AssertionError("did not raise")


def test_a_stack_deeper_than_the_limit_still_ends_with_the_users_frame() -> None:
    """FSDP's or Lightning's stacks are deeper than the frames a rank publishes: the user's line, which
    the report shows, is added after them."""
    import json

    frame = _innermost_frame_of(lambda: json.loads("{"))  # raises three stdlib frames below this file
    stack = stack_of(frame, limit=2)
    assert [f.library for f in stack[:2]] == ["python", "python"]
    assert stack[2].library is None and stack[2].path == __file__
    assert len(stack) == 3


def test_torch_distributed_wrappers_in_a_stack_are_torch_frames_not_the_users() -> None:
    import torch.distributed as dist

    frame = _innermost_frame_of(dist.get_rank)  # no process group: raised inside distributed_c10d
    stack = stack_of(frame)
    assert stack[0].path.endswith("distributed_c10d.py") and stack[0].library == "torch"
    assert [f.path for f in stack if f.library is None][0] == __file__


def test_code_run_from_a_string_is_no_users_line_and_the_library_line_that_called_it_is_named() -> None:
    """A spawned child's bootstrap (`python -c "...spawn_main()"`) runs as `<string>`: a report that named
    it said `<string>:1`. Past the library frames, a `<string>` frame is not the user's line: the library
    frame that issued the call is named instead."""
    namespace: dict = {"call_sites": call_sites}
    exec(compile("def issue():\n    return call_sites(1)\n", "<string>", "exec"), namespace)
    site, library = namespace["issue"]()
    # the first frame outside `<string>` on the way out is this test's: the user's line is still found
    assert site is not None and site.path == __file__
    assert classify("<string>")[0] == classify("<frozen runpy>")[0] != classify(__file__)[0]
