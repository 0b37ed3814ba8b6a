"""Where a CP call's GPU time goes, kernel by kernel, for each document layout (issue 39).

    torchrun --nproc_per_node=2 benchmarks/kernel_profile.py --per-gpu 16384 \
        --heads 32:8:128 --mix uniform --layouts whole_docs,pack_zigzag --out DIR

For each layout, ``burst_attn`` (causal, bf16, forward + backward, a new pack every call, as
``documents.py`` times it) is called three times to warm up, then ``--calls`` times under
``torch.profiler`` with CUDA activity. Rank 0 writes, per layout, the kernels sorted by their
total GPU time (name, calls, total and mean ms per profiled call) to ``DIR/<layout>.txt``,
and prints the first rows: the answer to "which kernels make one layout slower than the
other", measured rather than guessed.
"""
from __future__ import annotations

import argparse
import os
import sys

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.path.dirname(__file__))
from documents import burst_call, pack_lengths  # noqa: E402
from ranks import start_ranks  # noqa: E402


def kernel_table(prof, calls: int, rows: int = 30) -> str:
    """The profiled CUDA kernels by total time (ms per call)."""
    events = [e for e in prof.key_averages() if e.device_type.name == "CUDA"]
    events.sort(key=lambda e: e.self_device_time_total, reverse=True)
    # An NCCL call shows twice: its kernel, and an "nccl:..." range over the same time.
    total = sum(e.self_device_time_total for e in events
                if not e.key.startswith("nccl:")) / 1e3 / calls
    lines = [f"GPU time per call: {total:.3f} ms (kernels and copies; NCCL's time counted "
             f"once, waits for the peer included)",
             "| kernel | launches/call | ms/call | mean us |", "|---|---|---|---|"]
    for e in events[:rows]:
        ms = e.self_device_time_total / 1e3 / calls
        lines.append(f"| {e.key[:90]} | {e.count / calls:.1f} | {ms:.3f} | "
                     f"{e.self_device_time_total / max(e.count, 1):.1f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--per-gpu", type=int, default=16384)
    parser.add_argument("--heads", default="32:8:128", help="hq:hkv:head_dim")
    parser.add_argument("--mix", default="uniform")
    parser.add_argument("--layouts", default="whole_docs,pack_zigzag")
    parser.add_argument("--calls", type=int, default=5)
    parser.add_argument("--out", required=True, help="folder for the tables")
    args = parser.parse_args()
    rank, world = start_ranks()
    dev = torch.device("cuda", torch.cuda.current_device())
    hq, hkv, d = map(int, args.heads.split(":"))
    n = 3 + args.calls
    packs = [pack_lengths(args.per_gpu * world, args.mix, seed=500 + i) for i in range(n)]
    gen = torch.Generator(device=dev).manual_seed(rank)
    q, k, v, do = (torch.randn(1, args.per_gpu, h, d, device=dev, dtype=torch.bfloat16,
                               generator=gen) for h in (hq, hkv, hkv, hq))
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    os.makedirs(args.out, exist_ok=True)
    for layout in args.layouts.split(","):
        call, cus, _ = burst_call(layout, q, k, v, packs, packs, dev)
        for cu in cus[:3]:
            call(cu).backward(do)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for cu in cus[3:]:
                call(cu).backward(do)
            torch.cuda.synchronize()
        if rank == 0:
            text = (f"# {layout}: {args.per_gpu} tokens/GPU x {world} GPUs, {args.heads}, "
                    f"{args.mix}, {torch.cuda.get_device_name(0)}\n" + kernel_table(prof, args.calls))
            with open(os.path.join(args.out, f"{layout}.txt"), "w") as f:
                f.write(text + "\n")
            print("\n".join(text.splitlines()[:22]), flush=True)


if __name__ == "__main__":
    main()
