"""FlexAttention for large band blocks' forward, on the GPU (skipped without CUDA).

On one GPU: the automatic kernel sends a large band's forward to FlexAttention (compiled),
which passes its first-call check, and matches float64 (out, lse) on bands with tiles cut
by the block's edges. On two GPUs: the window families through ``burst_attn`` (area layout,
both backwards) in bf16 against float64, with FlexAttention having run their bands.
"""
from __future__ import annotations

import pytest
import torch

import megatron_burst as mb
from megatron_burst.kernels import flex
from megatron_burst.kernels.reference import ReferenceAttention
from megatron_burst.kernels.selection import pick_kernel
from megatron_burst.plan.schedule import Block

from .distributed import run_ranks
from .reference import reference_attention, slice_allowed

NGPU = torch.cuda.device_count() if torch.cuda.is_available() else 0
pytestmark = pytest.mark.skipif(NGPU < 1 or not flex.available(),
                                reason="needs a GPU and FlexAttention")

BANDS = [Block(0, 4096, 0, 4096, "band", -1024, 0),     # a causal window
         Block(0, 3000, 0, 4100, "band", 0, 2048),      # tiles cut by both edges
         Block(0, 2048, 0, 2048, "band", -700, 900)]    # two-sided


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def _flex_of(kernel) -> flex.FlexBandForward:
    band = getattr(kernel, "band", None)
    assert isinstance(band, flex.FlexBandForward), kernel.name
    return band


@pytest.mark.parametrize("block", BANDS, ids=lambda b: b.describe())
def test_large_bands_forward_through_flex_matches_float64(block):
    dev = torch.device("cuda", 0)
    hq, hkv, d = 8, 2, 128
    kernel = pick_kernel(None, torch.bfloat16, hq, hkv, d, dev)
    gen = torch.Generator(device=dev).manual_seed(block.q_stop + block.lo)
    n, m = block.q_stop, block.k_stop
    q = torch.randn(1, n, hq, d, device=dev, generator=gen, dtype=torch.bfloat16)
    k, v = (torch.randn(1, m, hkv, d, device=dev, generator=gen, dtype=torch.bfloat16)
            for _ in range(2))
    out, lse = kernel.forward(q, k, v, block, d ** -0.5)
    _flex_of(kernel)
    assert any(flex.signatures().values()), "FlexAttention did not run the band"
    r_out, r_lse = ReferenceAttention().forward(q.double(), k.double(), v.double(), block,
                                                d ** -0.5)
    assert rel(out, r_out) < 1e-2
    assert (lse.double() - r_lse).abs().max().item() < 1e-3


def window_worker(rank, world, backwards):
    """The window families at 4K tokens a GPU (bands of 2K+ rows reach FlexAttention)."""
    from megatron_burst.plan import mask_families as mf

    dev = torch.device("cuda", rank)
    torch.cuda.set_device(dev)
    gen = torch.Generator(device=dev).manual_seed(7)
    total, hq, hkv, d = 4096 * world, 8, 2, 128
    rows = []
    for name in ("sliding_window", "sliding_window_causal", "global_sliding_window"):
        mask = mf.family(name, (total,), window=1024, global_size=512)
        q, do = (torch.randn(1, total, hq, d, device=dev, generator=gen, dtype=torch.bfloat16)
                 for _ in range(2))
        k, v = (torch.randn(1, total, hkv, d, device=dev, generator=gen, dtype=torch.bfloat16)
                for _ in range(2))
        ref = [t.double().requires_grad_() for t in (q, k, v)]
        allowed = slice_allowed(total, mask.q_ranges, mask.k_ranges, mask.kinds).to(dev)
        r_out, r_lse = reference_attention(*ref, causal=False, scale=d ** -0.5, allowed=allowed)
        r_out.backward(do.double())
        for backward in backwards:
            local = [mb.shard_seq(t, mask=mask).requires_grad_() for t in (q, k, v)]
            out, lse = mb.burst_attn(*local, mask=mask, backward=backward, return_lse=True)
            out.backward(mb.shard_seq(do, mask=mask))
            row = dict(family=name, backward=backward,
                       err_out=rel(out, mb.shard_seq(r_out, mask=mask)),
                       err_lse=rel(lse, mb.shard_seq(r_lse, seq_dim=2, mask=mask)))
            for n, g, r in zip(("dq", "dk", "dv"), local, ref):
                row[f"err_{n}"] = rel(g.grad, mb.shard_seq(r.grad, mask=mask))
            rows.append(row)
    _flex_of(pick_kernel(None, torch.bfloat16, hq, hkv, d, dev))
    return rows, sum(flex.signatures().values())


@pytest.mark.skipif(NGPU < 2, reason="needs 2 GPUs")
def test_window_families_with_flex_bands_over_nccl():
    results = run_ranks(2, window_worker, ("burst", "ring"), backend="nccl", timeout=600)
    for rows, flex_shapes in results:
        assert flex_shapes >= 1, "no band reached FlexAttention"
        for r in rows:
            print("  ".join(f"{k}={v:.2e}" if isinstance(v, float) else f"{k}={v}"
                            for k, v in r.items()))
            for key in ("err_out", "err_dq", "err_dk", "err_dv"):
                assert r[key] < 2e-2, r  # NaN fails too
            assert r["err_lse"] < 1e-3, r
