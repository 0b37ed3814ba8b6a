"""Where a slice-mask call's time goes on the GPUs: its plan and a torch.profiler table.

    torchrun --nproc_per_node=2 benchmarks/slice_mask_profile.py --families sliding_window_causal

For each family (the masks, sizes and inputs of ``slice_masks.py``: GQA 64:8, d 128, bf16,
8K tokens per GPU): rank 0 prints its plan (per pass and ring step, each kernel launch: dense
or varlen, its blocks, rows, keys and mask shape; the hops), the forward's mean ms (no
grad) and fwd+bwd's, then torch.profiler's CUDA and CPU tables over 5 forward calls and 3
fwd+bwd calls (after warm-up).
"""
from __future__ import annotations

import argparse
import os
import sys
import time
import zlib

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import megatron_burst as mb  # noqa: E402
from megatron_burst.attention import prepare  # noqa: E402
from megatron_burst.plan import mask_families as mf  # noqa: E402
from ranks import start_ranks  # noqa: E402
from slice_masks import knobs, pile_like  # noqa: E402


def describe_plan(plan) -> list[str]:
    lines = []
    for name, pas in (("forward", plan.forward), ("backward", plan.backward)):
        for i, step in enumerate(pas.steps):
            hops = [(h.kind, h.n_send, h.n_recv) for h in step.hops]
            lines.append(f"  {name} step {i} (source {step.source}): hops {hops}")
            for c in step.calls:
                rows = sum(b.q_stop - b.q_start for b in c.blocks)
                keys = sum(b.k_stop - b.k_start for b in c.blocks)
                kinds = sorted({b.kind for b in c.blocks})
                area = sum(b.area for b in c.blocks)
                lines.append(f"    {'varlen' if c.varlen else 'dense '} blocks {len(c.blocks):3d} "
                             f"rows {rows:6d} keys {keys:6d} area {area:11d} kinds {kinds}")
    return lines


def mean_ms(fn, dev, n: int) -> float:
    torch.cuda.synchronize(dev)
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    torch.cuda.synchronize(dev)
    return (time.perf_counter() - t0) * 1e3 / n


def profile_family(name: str, args, rank: int, world: int, dev) -> None:
    total = args.tokens * world
    lens = pile_like(total, seed=zlib.crc32(name.encode()))
    mask = mf.family(name, lens, **knobs(total, 1.0))
    gen = torch.Generator(device=dev).manual_seed(1234)
    full = [torch.randn(1, total, h, 128, device=dev, dtype=torch.bfloat16, generator=gen)
            for h in (64, 8, 8, 64)]
    local = [mb.shard_seq(t, mask=mask).contiguous() for t in full]
    q, k, v = (t.requires_grad_() for t in local[:3])

    def fwd():
        with torch.no_grad():
            mb.burst_attn(q, k, v, mask=mask)

    def both():
        mb.burst_attn(q, k, v, mask=mask).backward(local[3])

    for _ in range(5):
        both()
    fwd_ms, both_ms = mean_ms(fwd, dev, 10), mean_ms(both, dev, 10)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof_f:
        for _ in range(5):
            fwd()
        torch.cuda.synchronize(dev)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof_b:
        for _ in range(3):
            both()
        torch.cuda.synchronize(dev)
    if rank == 0:
        plans = [p for p in prepare.PREPARED.values() if p.call.mask == mask]
        print(f"===== {name}: {len(lens)} documents, area {mask.area}, forward {fwd_ms:.2f} ms, "
              f"fwd+bwd {both_ms:.2f} ms (mean of 10)")
        for line in describe_plan(plans[-1].bound.plan):
            print(line)
        for label, prof in (("forward x5", prof_f), ("fwd+bwd x3", prof_b)):
            print(f"--- {label}: by CUDA time")
            print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=14))
            print(f"--- {label}: by CPU time")
            print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=10))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--families", default="sliding_window_causal,causal_document")
    p.add_argument("--tokens", type=int, default=8192)
    args = p.parse_args()
    rank, world = start_ranks()
    dev = torch.device("cuda", torch.cuda.current_device())
    for name in args.families.split(","):
        profile_family(name, args, rank, world, dev)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
