"""Where --remedy refuses a call instead of running it (remedy_limits): decided from the call's reduction,
the backend the remedy would run it on, and the tensors it writes."""

from __future__ import annotations

import torch

from ddpdoctor.audits.remedy_limits import overlapping, refusal


def test_premul_sum_is_refused_only_where_gloo_would_run_it() -> None:
    assert refusal("PREMUL_SUM", True, [torch.ones(2)]) is not None
    assert refusal("PREMUL_SUM", False, [torch.ones(2)]) is None  # NCCL has it
    assert refusal("SUM", True, [torch.ones(2)]) is None


def test_an_output_list_holding_one_buffer_twice_is_refused() -> None:
    buffer = torch.zeros(4)
    assert refusal("SUM", True, [buffer, buffer]) is not None
    assert refusal(None, True, [buffer[:3], buffer[2:]]) is not None  # overlapping views


def test_disjoint_views_of_one_buffer_are_fine() -> None:
    flat = torch.zeros(6)
    assert not overlapping(list(flat.chunk(3)))
    assert not overlapping([flat[:3], flat[3:], flat[1:1]])  # an empty view touches nothing
    assert refusal(None, True, list(flat.view(3, 2).unbind(0))) is None
