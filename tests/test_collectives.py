"""The shared table of torch.distributed ops (`ddpdoctor.collectives`) and every consumer derived from it:
each one covers every entry, or names the entries it leaves out and why."""

from __future__ import annotations

import inspect

import pytest

from ddpdoctor.check import collectives as check_collectives
from ddpdoctor.check import project
from ddpdoctor.check.rules.ddp301_cpu_tensor_nccl import CpuTensorOnNcclGroup
from ddpdoctor.collectives import BY_NAME, TORCH_DISTRIBUTED, Kind, Role, by_op_type

NAMES = {op.name for op in TORCH_DISTRIBUTED}
P2P = {op.name for op in TORCH_DISTRIBUTED if op.kind is Kind.POINT_TO_POINT}
GROUP_FORMING = {op.name for op in TORCH_DISTRIBUTED if op.kind is Kind.GROUP}


def test_every_entry_is_named_once():
    assert len(NAMES) == len(TORCH_DISTRIBUTED) == len(BY_NAME)


def test_every_entry_matches_the_installed_torch_signature():
    c10d = pytest.importorskip("torch.distributed.distributed_c10d")
    for op in TORCH_DISTRIBUTED:
        params = list(inspect.signature(getattr(c10d, op.name)).parameters)
        for tensor in op.tensors:
            assert params.index(tensor.name) == tensor.position, (op.name, tensor.name)
        assert set(op.roots) <= set(params), op.name


def test_the_checker_takes_every_op_but_point_to_point_as_a_collective():
    # A rank test is how point-to-point code says who sends and who receives: never a divergence.
    assert check_collectives.TORCH_COLLECTIVES == NAMES - P2P
    assert {"all_gather_single", "reduce_scatter_single", "new_group"} <= check_collectives.TORCH_COLLECTIVES


def test_the_tensor_positions_cover_every_collective_that_takes_a_tensor():
    single_tensor = {op.name for op in TORCH_DISTRIBUTED
                     if not op.p2p and any(not t.is_list for t in op.tensors)}
    assert set(check_collectives.TENSOR_ARGS) == single_tensor
    assert check_collectives.TENSOR_ARGS["all_gather"] == (1,)  # the input; the output is a list
    assert check_collectives.TENSOR_ARGS["all_gather_into_tensor"] == (0, 1)
    # Left out, with the reason: their tensors come in lists (not tensor expressions), they carry pickled
    # objects, or no tensor at all.
    assert NAMES - P2P - single_tensor == {
        "all_reduce_coalesced", "all_gather_coalesced", "all_to_all", "barrier", "monitored_barrier",
        *(op.name for op in TORCH_DISTRIBUTED if op.objects and not op.p2p), *GROUP_FORMING}


def test_the_project_index_and_ddp301_use_the_same_positions():
    assert project.TENSOR_ARGS is check_collectives.TENSOR_ARGS
    assert set(project.COLLECTIVE_WORDS) == set(check_collectives.TENSOR_ARGS)
    assert set(CpuTensorOnNcclGroup.triggers) == set(check_collectives.TENSOR_ARGS)


def test_the_guard_wraps_every_op_but_the_group_forming_ones():
    intercept = pytest.importorskip("ddpdoctor.guard.rank.intercept")
    # Group creation runs over the store before the group exists: nothing to fingerprint.
    assert set(intercept.GUARDED_OPS) == NAMES - GROUP_FORMING


def test_the_fingerprint_pairs_point_to_point_ops_with_one_peer():
    from ddpdoctor.guard.fingerprint import P2P_OPS, RENUMBERED_OPS

    assert P2P_OPS == P2P
    assert RENUMBERED_OPS == P2P | {"monitored_barrier"}


def test_the_guard_records_what_the_table_says_about_each_tensor():
    c10d = pytest.importorskip("torch.distributed.distributed_c10d")
    from ddpdoctor.guard.rank.intercept import GUARDED_OPS, OpSpec, role_of

    for name in GUARDED_OPS:
        spec = OpSpec(name, getattr(c10d, name))
        assert [t[1] for t in spec.tensors] == [t.name for t in BY_NAME[name].tensors]
        assert spec.compare_shapes == BY_NAME[name].shapes_agree
        assert spec.p2p == (name in P2P)
    assert role_of("all_gather", "tensor_list") == Role.OUT.value
    assert role_of("all_reduce", "tensor") == ""  # read and written in place: not labelled
    assert role_of("not_an_op", "tensor") == ""


def test_every_op_type_name_leads_back_to_its_ops():
    assert [op.name for op in by_op_type("_ALLGATHER_BASE")] == [
        "all_gather_into_tensor", "all_gather_single", "_all_gather_base"]
    assert by_op_type("ALLREDUCE")[0].name == "all_reduce"
    for op in TORCH_DISTRIBUTED:
        for op_type in op.op_types:
            assert op in by_op_type(op_type)


def test_explain_names_the_python_call_behind_an_op_type():
    from ddpdoctor.explain.diagnose import op_calls

    assert op_calls({"op_type": "_ALLGATHER_BASE"}) == {"op_call": "dist.all_gather_into_tensor"}
    assert op_calls({"op_a": "ALLREDUCE", "op_b": "BROADCAST"}) == {
        "op_a_call": "dist.all_reduce", "op_b_call": "dist.broadcast"}
    assert op_calls({"op_type": "NOT_AN_OP"}) == {}
    # Every OpType of the table leads to a public call (the `_base` forms print the names of public ones).
    for op in TORCH_DISTRIBUTED:
        for op_type in op.op_types:
            assert op_calls({"op_type": op_type}), op_type
