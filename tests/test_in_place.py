"""The forward's varlen calls read in place (``varlen.InPlaceBounds``): no gather of Q, K, V.

Which calls have the form and what their boundaries say; the loop kernel's in-place forward
against its packed one; the probe that admits a kernel to the form (and refuses one that
reads the keys wrongly, or raises); and on CPU ranks, the ring with the form on: the same
out, lse and gradients as packed, in both formats, and exact against the float64 reference.
"""
from __future__ import annotations

import pytest
import torch

from megatron_burst.kernels.in_place import probe_in_place
from megatron_burst.kernels.reference import CpuFlashAttention, ReferenceAttention
from megatron_burst.kernels.varlen import gather, in_place_bounds, plan_calls
from megatron_burst.plan import mask_families as mf
from megatron_burst.plan.schedule import Block

from .distributed import run_ranks
from .reference import reference_attention, slice_allowed
from .test_home_output import ring_call
from .test_slice_masks import KNOBS


def _calls(blocks):
    return plan_calls(blocks, varlen=True, dense_min_area=float("inf"), coalesce=False)


def test_bounds_cut_the_gaps_no_longer_than_a_block_and_name_each_sequence_block():
    (call,) = _calls([Block(0, 10, 0, 10, "causal"), Block(45, 55, 5, 15, "causal")])
    b = call.in_place
    # rows 10:45 between the blocks: pieces of at most 10 rows, of no keys
    assert b.cu_q == (0, 10, 20, 30, 40, 45, 55)
    assert b.seqused_k == (10, 0, 0, 0, 0, 10) and b.cu_k == (0, 0, 0, 0, 0, 5, 15)
    assert b.block_of == (0, -1, -1, -1, -1, 1) and (b.max_q, b.max_k) == (10, 10)
    # a leading gap too, and overlapping key ranges
    (call,) = _calls([Block(4, 8, 0, 6, "full"), Block(8, 12, 2, 9, "full")])
    assert call.in_place.cu_q == (0, 4, 8, 12) and call.in_place.cu_k == (0, 0, 2, 9)


def test_calls_whose_runs_are_views_already_have_no_in_place_form():
    (call,) = _calls([Block(0, 10, 0, 10, "causal"), Block(10, 20, 10, 20, "causal")])
    assert call.q_runs == ((0, 20),) and call.k_runs == ((0, 20),)
    assert call.in_place is None and in_place_bounds(call) is None
    dense = plan_calls([Block(0, 10, 0, 10, "causal")], varlen=False, dense_min_area=0.0)
    assert dense[0].in_place is None


@pytest.mark.parametrize("kernel", [ReferenceAttention(), CpuFlashAttention()])
def test_the_loop_in_place_gives_the_packed_rows(kernel):
    blocks = [Block(0, 12, 3, 15, "causal"), Block(20, 30, 0, 25, "causal"),
              Block(31, 40, 20, 29, "causal")]
    (call,) = _calls(blocks)
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(44, h, 8, generator=gen, dtype=torch.float64) for h in (4, 2, 2))
    out, lse = kernel.forward_varlen_in_place(q, k, v, call, 0.3)
    p_out, p_lse = kernel.forward_varlen(gather(q, call.q_runs), gather(k, call.k_runs),
                                         gather(v, call.k_runs), call, 0.3)
    off = 0
    for blk in blocks:
        n = blk.q_stop - blk.q_start
        assert torch.equal(out[blk.q], p_out[off:off + n])
        assert torch.equal(lse[:, blk.q], p_lse[:, off:off + n])
        off += n
    gaps = [r for r in range(44) if not any(b.q_start <= r < b.q_stop for b in blocks)]
    assert not out[gaps].any() and (lse[:, gaps] == float("inf")).all()


class _ReadsPacked(ReferenceAttention):
    """Reads each sequence's keys back to back (as if ``seqused_k`` were ignored)."""

    def forward_varlen_in_place(self, q, k, v, call, scale):
        return super().forward_varlen_in_place(q, k.roll(3, 0), v.roll(3, 0), call, scale)


class _Refuses(ReferenceAttention):
    def forward_varlen_in_place(self, q, k, v, call, scale):
        raise RuntimeError("unexpected keyword argument 'seqused_k'")


def test_the_probe_admits_a_kernel_that_reads_in_place_and_refuses_others():
    args = (torch.float32, 4, 2, 16, torch.device("cpu"))
    assert probe_in_place(CpuFlashAttention(), *args)
    assert probe_in_place(ReferenceAttention(), *args, dv=8)
    assert not probe_in_place(_ReadsPacked(), *args)
    assert not probe_in_place(_Refuses(), *args)


LENS = (40, 60, 30, 70, 56)


def ring_worker(rank, world, name, fmt, in_place):
    from megatron_burst.attention import call_plan
    from megatron_burst.kernels import protocol

    protocol.VarlenByLoop.varlen_in_place = in_place  # (this rank's process only)
    ReferenceAttention.dense_min_area = 256.0  # some blocks alone: gaps in the varlen calls
    call_plan.clear()
    used = [0]
    real = protocol.VarlenByLoop.forward_varlen_in_place

    def counted(self, *args):
        used[0] += 1
        return real(self, *args)

    protocol.VarlenByLoop.forward_varlen_in_place = counted
    lens = LENS if world != 3 else LENS[:-1] + (LENS[-1] - 1,)  # 255 rows on three ranks
    total = sum(lens)
    mask = mf.family(name, lens, **dict(KNOBS, block=16))
    torch.manual_seed(7)
    full = [torch.randn(1, total, h, 8, dtype=torch.float64) for h in (4, 2, 2, 4)]
    out, lse, grads, shard = ring_call(mask, full, fmt)
    whole = [t.clone().requires_grad_() for t in full[:3]]
    ref = reference_attention(*whole, causal=False, scale=8 ** -0.5, allowed=slice_allowed(
        total, mask.q_ranges, mask.k_ranges, mask.kinds))[0]
    ref_grads = torch.autograd.grad(ref, whole, full[3])
    ref_local = [shard(t) for t in (ref, *ref_grads)]
    err = max((a - b).abs().max().item() for a, b in zip((out, *grads), ref_local))
    return out, lse, grads, used[0], err


@pytest.mark.parametrize("fmt", ["bshd", "sbhd"])
@pytest.mark.parametrize("name,world", [("block_causal_document", 2),
                                        ("prefix_lm_document", 2), ("causal_blockwise", 3),
                                        ("global_sliding_window", 4)])
def test_the_ring_read_in_place_is_the_packed_ring(name, world, fmt):
    """Out, lse and every gradient the same as the packed form's to 1e-12 (float64), exact
    against the float64 reference, and the in-place form used on some rank."""
    in_place = run_ranks(world, ring_worker, name, fmt, True)
    packed = run_ranks(world, ring_worker, name, fmt, False)
    assert any(r[3] for r in in_place) and not any(r[3] for r in packed)
    for a, b in zip(in_place, packed):
        assert (a[0] - b[0]).abs().max() < 1e-12 and (a[1] - b[1]).abs().max() < 1e-12
        assert all((x - y).abs().max() < 1e-12 for x, y in zip(a[2], b[2]))
        assert a[4] < 1e-10 and not torch.isnan(a[0]).any()
