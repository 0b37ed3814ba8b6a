"""GPU check of carved shape-free plans (skipped without CUDA): new masks every call, their
full and causal blocks carved into cores on cuDNN (``blocks.carved``), exact in bf16 against
the float64 dense reference (out, lse, dq, dk, dv), on one GPU and on a ring of two with
the ring's carving switched on (``thresholds.CARVE_RINGS``), and each plan after the first
mask holds carved cores; and document packs (``cu_seqlens``) with their large documents
carved (``thresholds.CARVE_PACKS``) on one GPU and on two. The grain is set small (256) so
4K-token masks carve; the CPU tests (``tests/test_shape_free_cores.py``,
``tests/test_pack_carving.py``) check the carving pair by pair in float64.
"""
from __future__ import annotations

import math

import pytest
import torch

import megatron_burst as mb
from megatron_burst.plan import mask_families as mf

from .distributed import run_ranks
from .reference import reference_attention, slice_allowed

NGPU = torch.cuda.device_count() if torch.cuda.is_available() else 0
SEQ, HQ, HKV, D, GRAIN = 4096, 8, 2, 64, 256
PACKS = ((1500, 900, 700, 600, 396), (2300, 1100, 400, 296), (800, 1900, 1000, 396))
TOL = 2e-2  # bf16


def _reference(mask, q, k, v, dout) -> dict:
    """float64 on the inputs' device (the GPU's float64 is quick at 4K tokens)."""
    leaves = [t.double().clone().requires_grad_() for t in (q, k, v)]
    allowed = slice_allowed(SEQ, mask.q_ranges, mask.k_ranges, mask.kinds).to(q.device)
    out, lse = reference_attention(*leaves, causal=False, scale=1 / math.sqrt(D),
                                   allowed=allowed)
    out.backward(dout.double())
    return {"out": out.detach(), "lse": lse.detach().transpose(1, 2), "dq": leaves[0].grad,
            "dk": leaves[1].grad, "dv": leaves[2].grad}


def carved_worker(rank, world, family, rings):
    """Each pack's relative errors (rank 0) and each shape-free plan's count of cores."""
    from megatron_burst.attention import call_plan, prepare, varying_masks
    from megatron_burst.kernels import thresholds

    thresholds.SHAPE_FREE_GRAIN, thresholds.CARVE_RINGS = GRAIN, rings
    varying_masks.clear()
    call_plan.clear()
    prepare.PREPARED.clear()
    dev = torch.device("cuda", torch.cuda.current_device())
    errors = []
    for i, lens in enumerate(PACKS):
        mask = mf.family(family, lens, prefix=SEQ // 4, window=256, global_size=256,
                         block=256)
        gen = torch.Generator().manual_seed(100 + i)
        full = [torch.randn(1, SEQ, h, D, generator=gen) for h in (HQ, HKV, HKV, HQ)]
        local = [mb.shard_seq(t, mask=mask).to(dev, torch.bfloat16) for t in full]
        q, k, v = (t.requires_grad_() for t in local[:3])
        out, lse = mb.burst_attn(q, k, v, mask=mask, return_lse=True)
        out.backward(local[3])
        got = {"out": out, "lse": lse.transpose(1, 2), "dq": q.grad, "dk": k.grad,
               "dv": v.grad}
        whole = {n: mb.unshard_seq(t.detach().double().contiguous(), mask=mask)
                 for n, t in got.items()}
        if rank == 0:  # the reference on the bf16 inputs themselves
            refs = _reference(mask, *[t.to(dev, torch.bfloat16) for t in full])
            errors.append({n: ((whole[n] - refs[n]).norm() / refs[n].norm()).item()
                           for n in refs})
    cores = [sum(not c.varlen for c in plan.calls) for key, plan in call_plan._PLANS.items()
             if key.grain is not None]
    return errors, cores


def _check(results) -> None:
    errors, _ = results[0]
    bad = [(i, n, e) for i, err in enumerate(errors) for n, e in err.items()
           if not e <= TOL]  # (NaN fails too)
    assert not bad, bad
    for rank, (_, cores) in enumerate(results):
        assert cores and all(cores), (rank, cores)  # every carved plan holds cores


@pytest.mark.skipif(NGPU < 1, reason="needs a GPU")
@pytest.mark.parametrize("family", ["causal_document", "shared_question"])
def test_carved_new_masks_are_exact_on_one_gpu(family):
    _check(run_ranks(1, carved_worker, family, False, backend="nccl"))


@pytest.mark.skipif(NGPU < 2, reason="needs 2 GPUs")
@pytest.mark.parametrize("family", ["causal_document", "causal_blockwise"])
def test_carved_new_masks_are_exact_on_a_ring_of_two(family):
    _check(run_ranks(2, carved_worker, family, True, backend="nccl"))


def pack_worker(rank, world, causal):
    """Document packs (``cu_seqlens``) with their large documents carved
    (``thresholds.CARVE_PACKS``): each pack's relative errors (rank 0) and each carved pack
    plan's count of cores."""
    import itertools

    from megatron_burst.attention import call_plan, prepare
    from megatron_burst.kernels import thresholds

    thresholds.SHAPE_FREE_GRAIN, thresholds.CARVE_PACKS = GRAIN, True
    thresholds.PACK_CARVE_MIN = GRAIN
    call_plan.clear()
    prepare.PREPARED.clear()
    dev = torch.device("cuda", torch.cuda.current_device())
    errors = []
    for i, lens in enumerate(PACKS):
        cu = torch.tensor([0, *itertools.accumulate(lens)], dtype=torch.int32)
        gen = torch.Generator().manual_seed(200 + i)
        full = [torch.randn(1, SEQ, h, D, generator=gen) for h in (HQ, HKV, HKV, HQ)]
        local = [mb.shard_seq(t, cu_seqlens=cu).to(dev, torch.bfloat16) for t in full]
        q, k, v = (t.requires_grad_() for t in local[:3])
        out, lse = mb.burst_attn(q, k, v, causal=causal, cu_seqlens=cu, return_lse=True)
        out.backward(local[3])
        got = {"out": out, "lse": lse.transpose(1, 2), "dq": q.grad, "dk": k.grad,
               "dv": v.grad}
        whole = {n: mb.unshard_seq(t.detach().double().contiguous(), cu_seqlens=cu)
                 for n, t in got.items()}
        if rank == 0:
            inputs = [t.to(dev, torch.bfloat16).double() for t in full]
            leaves = [t.clone().requires_grad_() for t in inputs[:3]]
            doc_ids = torch.repeat_interleave(torch.arange(len(lens)), torch.tensor(lens))
            ref, ref_lse = reference_attention(*leaves, causal=causal, scale=1 / math.sqrt(D),
                                               doc_ids=doc_ids)
            ref.backward(inputs[3])
            refs = {"out": ref.detach(), "lse": ref_lse.detach().transpose(1, 2),
                    "dq": leaves[0].grad, "dk": leaves[1].grad, "dv": leaves[2].grad}
            errors.append({n: ((whole[n] - refs[n]).norm() / refs[n].norm()).item()
                           for n in refs})
    cores = [sum(not c.varlen for c in plan.calls) for key, plan in call_plan._PLANS.items()
             if key.pack and key.grain is not None]
    return errors, cores


@pytest.mark.skipif(NGPU < 2, reason="needs 2 GPUs")
@pytest.mark.parametrize("world,causal", [(1, True), (2, True), (2, False)])
def test_carved_packs_are_exact_on_gpus(world, causal):
    _check(run_ranks(world, pack_worker, causal, backend="nccl"))
