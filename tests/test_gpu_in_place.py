"""GPU check of the forward's varlen calls read in place (skipped without CUDA): the probe
admits PyTorch's flash kernel (``seqused_k``), the automatic kernel takes the form, and on
the plans of LongCA-bench's shape (8K tokens a GPU, 64:8 heads, d 128, bf16) every run of
every in-place call gives the packed form's rows. The ring with the form over NCCL is
``tests/test_gpu.py``'s slice-mask test against float64 (six of its families have in-place
calls); CPU ranks check the same ring to 1e-12 (``tests/test_in_place.py``).
"""
from __future__ import annotations

import os
import sys

import pytest
import torch

from megatron_burst.attention.call_plan import RingKey, build_plan, plan_key
from megatron_burst.kernels.cuda import TorchFlashAttention
from megatron_burst.kernels.in_place import probe_in_place
from megatron_burst.kernels.run_calls import forward_partial, partial_runs
from megatron_burst.kernels.selection import VARLEN_DENSE_MIN_AREA, pick_kernel

NGPU = torch.cuda.device_count() if torch.cuda.is_available() else 0
pytestmark = pytest.mark.skipif(NGPU < 1, reason="needs a GPU")
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))


def test_the_probe_admits_torch_flash_and_the_automatic_kernel_reads_in_place():
    dev = torch.device("cuda")
    assert probe_in_place(TorchFlashAttention(), torch.bfloat16, 64, 8, 128, dev)
    assert pick_kernel(None, torch.bfloat16, 64, 8, 128, dev).varlen_in_place


@pytest.mark.parametrize("name", ["block_causal_document", "causal_blockwise"])
def test_every_run_of_an_in_place_call_is_the_packed_calls_rows(name):
    from slice_masks import family_mask

    dev = torch.device("cuda")
    kernel = pick_kernel(None, torch.bfloat16, 64, 8, 128, dev)
    mask, seen = family_mask(name, 16384), 0
    gen = torch.Generator(device=dev).manual_seed(0)
    q, k, v = (torch.randn(1, 8192, h, 128, device=dev, dtype=torch.bfloat16, generator=gen)
               for h in (64, 8, 8))
    for rank in range(2):
        plan = build_plan(plan_key("area", 2, (16384,), mask, 1, RingKey((0, 1), rank, None),
                                   "ring", dense_min_area=VARLEN_DENSE_MIN_AREA))
        for call in (c for s in plan.forward.steps for c in s.calls if c.varlen):
            if call.in_place is None:
                continue
            seen += 1
            got = list(partial_runs(call, *forward_partial(kernel, call, q, k, v, 0.088)))
            kernel.varlen_in_place = False
            try:
                want = list(partial_runs(call, *forward_partial(kernel, call, q, k, v, 0.088)))
            finally:
                kernel.varlen_in_place = True
            for (a, o, lse), (b, r_o, r_lse) in zip(got, want, strict=True):
                assert a == b and o.shape == r_o.shape
                assert (o.float() - r_o.float()).abs().max() < 1e-2
                assert (lse - r_lse).abs().max() < 1e-3 and not torch.isnan(o).any()
    assert seen >= 2
