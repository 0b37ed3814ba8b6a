"""The forward's first call over every row becomes the accumulator (``home_output``).

Which plans start with one call over every row (``PassPlan.home_from_first``), and, on two CPU
ranks, that the output burst_attn returns is then that call's own tensor (no copy), while a
kernel whose output is laid out otherwise still gets a fresh accumulator; both exact against
the float64 reference. And which forwards join their home from step 0's pieces
(``PassPlan.home_pieces``), whose out, lse and gradients are then the written home's bit for
bit.
"""
from __future__ import annotations

import pytest
import torch

import megatron_burst as mb
from megatron_burst.attention.call_plan import RingKey, build_plan, plan_key
from megatron_burst.plan import mask_families as mf
from megatron_burst.plan.schedule import Mask

from .distributed import run_ranks
from .reference import reference_attention, slice_allowed
from .test_slice_masks import KNOBS


def _plans(layout, docs, mask, world=2):
    return [build_plan(plan_key(layout, world, docs, mask, 1,
                                RingKey(tuple(range(world)), r, None), "ring",
                                dense_min_area=float("inf"))) for r in range(world)]


@pytest.mark.parametrize("layout,mask,whole", [
    ("zigzag", Mask(True), [True, True]),  # the two causal chunks and their full block: one
    ("contiguous", Mask(True, (6, 0)), [True, True]),  # the window's band over every row
    ("contiguous", Mask(False), [True, True]),
    ("area", mf.family("causal_document", (5, 9, 3, 47), **KNOBS), [True, True]),  # varlen
    # Rank 1's rows see no key: nothing writes them, so they start from zeros.
    ("contiguous", mb.SliceMask(q_ranges=[(0, 40)], k_ranges=[(0, 40)], kinds=["causal"]),
     [True, False]),
    # The first call covers some rows only (the prefix's blocks go in a call of their own).
    ("area", mf.family("prefix_lm_document", (5, 9, 3, 47), **KNOBS), [False, False]),
])
def test_which_plans_start_with_one_call_over_every_row(layout, mask, whole):
    plans = _plans(layout, (64,), mask)
    assert [p.forward.home_from_first for p in plans] == whole
    # The 'ring' backward's home is dQ, from the same calls: the same answer.
    assert [p.backward.home_from_first for p in plans] == whole


def adopt_worker(rank, world, strided, case, fmt):
    from megatron_burst.kernels import reference

    made = {"forward": [], "backward": []}
    kernel = reference.ReferenceAttention
    # A pack's first call is one varlen call over every row; a plain sequence's a dense one.
    fwd_name, bwd_name = ("forward_varlen", "backward_varlen") if case == "documents" else \
        ("forward", "backward")
    real_fwd, real_bwd = getattr(kernel, fwd_name), getattr(kernel, bwd_name)

    def laid_out(t):
        # The same values, contiguous (as flash and cuDNN return them), or with the heads
        # outermost: then the ring must copy them into an accumulator of its own.
        rows = t.dim() - 3  # [b, s, h, d] or a varlen call's [s, h, d]
        return (t.transpose(rows, rows + 1).contiguous().transpose(rows, rows + 1)
                if strided else t.contiguous())

    def forward(self, *args):
        o, lse = real_fwd(self, *args)
        made["forward"].append(laid_out(o))
        return made["forward"][-1], lse

    def backward_(self, *args):
        dq, dk, dv = real_bwd(self, *args)
        made["backward"].append(laid_out(dq))
        return made["backward"][-1], dk, dv

    setattr(kernel, fwd_name, forward)
    setattr(kernel, bwd_name, backward_)
    mask = mf.family("causal_document", (5, 9, 3, 47)) if case == "documents" else \
        mb.SliceMask(q_ranges=[(0, 64)], k_ranges=[(0, 64)], kinds=["causal"])
    torch.manual_seed(3)
    full = [torch.randn(1, 64, h, 8, dtype=torch.float64) for h in (4, 2, 2, 4)]
    seq = 0 if fmt == "sbhd" else 1  # sbhd: the same tensors, sequence first

    def shard(t):  # [1, s, h, d] -> this rank's rows in the call's format
        return mb.shard_seq(t.transpose(0, 1) if seq == 0 else t, mask=mask, seq_dim=seq)

    q, k, v, do = (shard(t).requires_grad_() for t in full)
    out = mb.burst_attn(q, k, v, mask=mask, kernel="reference", backward="ring",
                        qkv_format=fmt)
    dq, = torch.autograd.grad(out, q, do)
    whole = [t.clone().requires_grad_() for t in full[:3]]
    ref = reference_attention(*whole, causal=False, scale=8 ** -0.5, allowed=slice_allowed(
        64, mask.q_ranges, mask.k_ranges, mask.kinds))[0]
    ref_dq, = torch.autograd.grad(ref, whole[0], full[3])
    return (out.data_ptr() == made["forward"][0].data_ptr(),
            dq.data_ptr() == made["backward"][0].data_ptr(),
            max((out - shard(ref)).abs().max().item(), (dq - shard(ref_dq)).abs().max().item()))


@pytest.mark.parametrize("fmt", ["bshd", "sbhd"])
@pytest.mark.parametrize("case", ["causal", "documents"])
@pytest.mark.parametrize("strided", [False, True])
def test_the_first_call_over_every_row_is_the_output_unless_laid_out_otherwise(strided, case,
                                                                                fmt):
    """The forward's out, and the 'ring' backward's dQ (its home accumulator), in both
    formats (sbhd: the kernels' bshd output seen sequence first is laid out as sbhd)."""
    for out_adopted, dq_adopted, err in run_ranks(2, adopt_worker, strided, case, fmt):
        assert out_adopted is (not strided)
        assert dq_adopted is (not strided)
        assert err < 1e-12


def _areas(threshold: float, world: int = 2):
    """Each rank's plan of a 256-token area layout, blocks of ``threshold`` pairs alone."""
    return lambda mask: [build_plan(plan_key(
        "area", world, (256,), mask, 1, RingKey(tuple(range(world)), r, None), "ring",
        dense_min_area=threshold)) for r in range(world)]


LENS = (40, 60, 30, 70, 56)
PIECED = dict(KNOBS, block=16)  # blocks of 16: block-causal documents' step 0 in pieces


@pytest.mark.parametrize("name,threshold", [
    ("block_causal_document", 256.0), ("full_document", 256.0), ("causal_document", 256.0),
    ("prefix_lm_document", float("inf")), ("causal", 256.0), ("sliding_window", 256.0)])
def test_step_zero_pieces_that_tile_every_row_join_into_the_home(name, threshold):
    """``PassPlan.home_pieces``: every run of step 0 a first write, together every row once,
    at least ``PIECES_MIN`` of them; never beside ``home_from_first`` (one call over every
    row is the home as it is)."""
    from megatron_burst.attention.first_writes import PIECES_MIN

    plans = _areas(threshold)(mf.family(name, LENS, **PIECED))
    for plan in plans:
        f = plan.forward
        runs = sum(len(w[0]) for w in f.writes[0])
        tiled = f.fresh[0] and all(all(w[0]) for w in f.writes[0]) and runs >= PIECES_MIN
        assert f.home_pieces == (tiled and not f.home_from_first)
    assert any(p.forward.home_pieces for p in plans) == name.endswith("document")


def pieces_worker(rank, world, name, threshold, fmt, minimum, batch=1):
    from megatron_burst.attention import call_plan, first_writes
    from megatron_burst.kernels.reference import ReferenceAttention

    first_writes.PIECES_MIN = minimum  # 10**9: every run written by a fold, as before
    ReferenceAttention.dense_min_area = threshold  # (this rank's process only)
    call_plan.clear()
    mask = mf.family(name, LENS, **PIECED)
    torch.manual_seed(5)
    full = [torch.randn(batch, 256, h, 8, dtype=torch.float32) for h in (4, 2, 2, 4)]
    out, lse, grads, _ = ring_call(mask, full, fmt)
    took = [p.forward.home_pieces for p in call_plan._PLANS.values()]
    return out, lse, grads, any(took)


def ring_call(mask, full: list, fmt: str) -> tuple:
    """The reference kernel's burst_attn on this rank's shard of ``full`` (q, k, v and dout,
    [b, s, h, d]) in ``fmt``: (out, lse, the gradients of q, k, v, the shard function)."""
    seq = 0 if fmt == "sbhd" else 1

    def shard(t):
        return mb.shard_seq(t.transpose(0, 1) if seq == 0 else t, mask=mask, seq_dim=seq)

    q, k, v, do = (shard(t).contiguous().requires_grad_() for t in full)
    out, lse = mb.burst_attn(q, k, v, mask=mask, kernel="reference", qkv_format=fmt,
                             return_lse=True)
    grads = torch.autograd.grad(out, (q, k, v), do)
    return out.detach(), lse.detach(), grads, shard


@pytest.mark.parametrize("fmt", ["bshd", "sbhd"])
@pytest.mark.parametrize("name,threshold,batch", [("block_causal_document", 256.0, 1),
                                                  ("causal_document", 256.0, 1),
                                                  ("prefix_lm_document", float("inf"), 1),
                                                  ("block_causal_document", 256.0, 2)])
def test_the_joined_home_is_the_written_home_bit_for_bit(name, threshold, batch, fmt):
    """The same call with step 0's home joined from its pieces and written run by run: the
    same bits in out, lse and every gradient (both are copies of the same partials); a
    batch of two rows runs every block as a dense call, joined the same way."""
    joined = run_ranks(2, pieces_worker, name, threshold, fmt, 3, batch)
    written = run_ranks(2, pieces_worker, name, threshold, fmt, 10 ** 9, batch)
    assert any(r[3] for r in joined) and not any(r[3] for r in written)
    for a, b in zip(joined, written):
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
        assert all(torch.equal(x, y) for x, y in zip(a[2], b[2]))
