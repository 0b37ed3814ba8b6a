"""Where a slice-mask call's time goes on the GPUs: its plan and a torch.profiler table.

    torchrun --nproc_per_node=2 benchmarks/slice_mask_profile.py --families sliding_window_causal

For each family (the masks, sizes and inputs of ``slice_masks.py``: GQA 64:8, d 128, bf16,
8K tokens per GPU): rank 0 prints its plan (per pass and ring step, each kernel launch: dense
or varlen, its blocks, rows, keys and mask shape; the hops), the forward's mean ms (no
grad) and fwd+bwd's, then torch.profiler's CUDA and CPU tables over 5 forward calls and 3
fwd+bwd calls (after warm-up). ``--fresh``: also fwd+bwd with a new document pack (so a new
mask) every call, as training feeds them, against the same mask, each call synchronised
and the ranks aligned (``slice_masks.py``'s "new pack" column: on 2x H100 prefix-LM
documents ran 414 TFLOP/s per GPU on one mask, 164 on new ones), then torch.profiler's
tables over 3 new-mask calls. ``--copies``: also every copy, cast and fill of the forward,
by shapes and by the package's lines that made it (the causal window's forward ran two 45
us device copies a call on 2x H100, one of them not accounted for).
"""
from __future__ import annotations

import argparse
import itertools
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
from slice_masks import knobs, pile_like, timed  # noqa: E402


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


COPIES = ("aten::copy_", "aten::_to_copy", "aten::fill_", "aten::zero_")


def copies_table(events, package: str = "megatron_burst") -> list[str]:
    """Rows of (count, device us in all, op, input shapes, the package's frames that called
    it) over ``events`` (a profile's ``events()`` recorded with shapes and stacks)."""
    seen: dict = {}
    for e in events:
        if e.name not in COPIES:
            continue
        frames = tuple(_frames(e, package))[:3]
        key = (e.name, str(e.input_shapes), frames)
        count, us = seen.get(key, (0, 0.0))
        seen[key] = (count + 1, us + getattr(e, "device_time_total", 0.0))
    rows = sorted(seen.items(), key=lambda kv: -kv[1][1])
    return [f"{n:4d} x {us:9.1f} us  {name} {shapes}\n        " + "\n        ".join(frames)
            for (name, shapes, frames), (n, us) in rows]


def _frames(event, package: str):
    """The package's Python frames above ``event``, innermost first: the stack as the event's
    own, or (torch's Python tracer) as the function events it sits under."""
    yield from (f for f in (event.stack or ()) if package in f)
    parent = event.cpu_parent
    while parent is not None:
        if package in parent.name:
            yield parent.name
        parent = parent.cpu_parent


def mean_ms(fn, dev, n: int) -> float:
    torch.cuda.synchronize(dev)
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    torch.cuda.synchronize(dev)
    return (time.perf_counter() - t0) * 1e3 / n


def profile_fresh(name: str, args, rank: int, world: int, dev, full) -> None:
    """fwd+bwd on one mask and on a new pack's mask every call; the new masks' profile."""
    total, base = args.tokens * world, zlib.crc32(name.encode())
    masks = (mf.family(name, pile_like(total, seed=base + 1 + i), **knobs(total, 1.0))
             for i in itertools.count())
    same = next(masks)

    def call(mask=None):
        mask = next(masks) if mask is None else mask
        q, k, v, do = (mb.shard_seq(t, mask=mask).contiguous() for t in full)
        mb.burst_attn(*(t.requires_grad_() for t in (q, k, v)), mask=mask).backward(do)

    for _ in range(6):  # 'auto' decides and checks its first new masks' keys
        call()
    # Each call synchronised and the ranks aligned before it (``slice_masks.timed``).
    same_ms = timed(lambda: call(same), dev, 1, 10, align=True)
    new_ms = timed(call, dev, 0, 10, align=True)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            call()
        torch.cuda.synchronize(dev)
    if rank == 0:
        print(f"===== {name}, fwd+bwd a call: one mask {same_ms:.2f} ms, a new mask every "
              f"call {new_ms:.2f} ms (means of 10, each call synchronised)")
        print("--- new masks x3: by CUDA time")
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=14))
        print("--- new masks x3: by CPU time")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=14))


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
    if args.copies:
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
                     record_shapes=True, with_stack=True) as prof_c:
            for _ in range(5):
                fwd()
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
        if args.copies:
            print("--- forward x5: copies, casts and fills")
            print("\n".join(copies_table(prof_c.events())))
    if args.fresh:
        profile_fresh(name, args, rank, world, dev, full)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--families", default="sliding_window_causal,causal_document")
    p.add_argument("--tokens", type=int, default=8192)
    p.add_argument("--fresh", action="store_true",
                   help="also a new mask every call against one mask, and its profile")
    p.add_argument("--copies", action="store_true",
                   help="also list the forward's copies, casts and fills by the lines that "
                        "made them")
    args = p.parse_args()
    rank, world = start_ranks()
    dev = torch.device("cuda", torch.cuda.current_device())
    for name in args.families.split(","):
        profile_family(name, args, rank, world, dev)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
