"""The forward's first call over every row becomes the accumulator (``home_output``).

Which plans start with one dense block over every row (``starts_whole``), and, on two CPU
ranks, that the output burst_attn returns is then that call's own tensor (no copy), while a
kernel whose output is laid out otherwise still gets a fresh accumulator; both exact against
the float64 reference.
"""
from __future__ import annotations

import pytest
import torch

import megatron_burst as mb
from megatron_burst.attention.call_plan import RingKey, build_plan, plan_key
from megatron_burst.attention.home_output import starts_whole
from megatron_burst.plan import mask_families as mf
from megatron_burst.plan.schedule import Mask

from .distributed import run_ranks
from .reference import reference_attention
from .test_slice_masks import KNOBS


def _plans(layout, docs, mask, world=2):
    return [build_plan(plan_key(layout, world, docs, mask, 1,
                                RingKey(tuple(range(world)), r, None), "ring",
                                dense_min_area=float("inf"))) for r in range(world)]


@pytest.mark.parametrize("layout,mask,whole", [
    ("zigzag", Mask(True), True),  # step 0: the two causal chunks and their full block, one
    ("contiguous", Mask(True, (6, 0)), True),  # the window's band over every row
    ("contiguous", Mask(False), True),
    ("area", mf.family("causal_document", (5, 9, 3, 47), **KNOBS), False),  # blocks a doc
])
def test_which_plans_start_with_one_call_over_every_row(layout, mask, whole):
    for plan in _plans(layout, (64,), mask):
        assert starts_whole(plan.forward, plan.rows) is whole


def adopt_worker(rank, world, strided, backward):
    from megatron_burst.kernels import reference

    made = {"forward": [], "backward": []}
    kernel = reference.ReferenceAttention
    real_fwd, real_bwd = kernel.forward, kernel.backward

    def laid_out(t):
        # The same values, contiguous (as flash and cuDNN return them), or laid out
        # [b, h, s, d]: then the ring must copy them into an accumulator of its own.
        return t.transpose(1, 2).contiguous().transpose(1, 2) if strided else t.contiguous()

    def forward(self, *args):
        o, lse = real_fwd(self, *args)
        made["forward"].append(laid_out(o))
        return made["forward"][-1], lse

    def backward_(self, *args):
        dq, dk, dv = real_bwd(self, *args)
        made["backward"].append(laid_out(dq))
        return made["backward"][-1], dk, dv

    kernel.forward, kernel.backward = forward, backward_
    torch.manual_seed(3)
    full = [torch.randn(1, 64, h, 8, dtype=torch.float64) for h in (4, 2, 2, 4)]
    q, k, v, do = (mb.shard_seq(t, layout="zigzag").requires_grad_() for t in full)
    out = mb.burst_attn(q, k, v, causal=True, kernel="reference", backward=backward)
    dq, = torch.autograd.grad(out, q, do)
    whole = [t.clone().requires_grad_() for t in full[:3]]
    ref = reference_attention(*whole, causal=True, scale=8 ** -0.5)[0]
    ref_dq, = torch.autograd.grad(ref, whole[0], full[3])
    shard = lambda t: mb.shard_seq(t, layout="zigzag")  # noqa: E731
    return (out.data_ptr() == made["forward"][0].data_ptr(),
            dq.data_ptr() == made["backward"][0].data_ptr(),
            max((out - shard(ref)).abs().max().item(), (dq - shard(ref_dq)).abs().max().item()))

@pytest.mark.parametrize("strided", [False, True])
def test_the_first_call_over_every_row_is_the_output_unless_laid_out_otherwise(strided):
    """The forward's out, and the 'ring' backward's dQ (its home accumulator)."""
    for out_adopted, dq_adopted, err in run_ranks(2, adopt_worker, strided, "ring"):
        assert out_adopted is (not strided)
        assert dq_adopted is (not strided)
        assert err < 1e-12
