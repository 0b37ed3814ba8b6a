"""Where a CP call's GPU time goes, kernel by kernel, for each document layout (issue 39).

    torchrun --nproc_per_node=2 benchmarks/kernel_profile.py --per-gpu 16384 \
        --heads 32:8:128 --mix uniform --layouts whole_docs,pack_zigzag --out DIR

For each layout, ``burst_attn`` (causal, bf16, forward + backward, a new pack every call, as
``documents.py`` times it) is called three times to warm up, then ``--calls`` times under
``torch.profiler`` with CUDA activity. Rank 0 writes, per layout, the kernels sorted by their
total GPU time (name, calls, total and mean ms per profiled call) to ``DIR/<layout>.txt``,
and prints the first rows: the answer to "which kernels make one layout slower than the
other", measured rather than guessed.

``--timeline``: each rank also exports the profiled calls' trace (``DIR/<layout>_rank<r>.json.gz``)
and writes where the GPU sat idle (``DIR/<layout>_timeline_rank<r>.txt``): per call, the wall
from the first to the last GPU activity, the time some non-NCCL kernel ran, and the longest
stretches without one, with the kernels on either side and the NCCL kernels running then.
A layout such as ``pack_zigzag+graph`` (``documents.burst_call``) profiles graph replays.
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
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


def _gpu_events(trace: str) -> list[tuple[float, float, str]]:
    """(start us, end us, name) of every kernel, copy and memset in a chrome trace."""
    with open(trace) as f:
        events = json.load(f)["traceEvents"]
    return sorted((e["ts"], e["ts"] + e["dur"], e["name"]) for e in events
                  if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"))


def _merged(spans):
    """The union of (start, end, name) spans: (start, end, first name, last name) runs."""
    runs = []
    for a, b, name in spans:
        if runs and a <= runs[-1][1]:
            runs[-1][1], runs[-1][3] = max(runs[-1][1], b), name
        else:
            runs.append([a, b, name, name])
    return runs


def timeline(trace: str, calls: int, gaps: int = 12) -> str:
    """Where the GPU sat idle in ``trace`` (see the module docstring)."""
    spans = _gpu_events(trace)
    nccl = [x for x in spans if x[2].startswith("nccl")]
    runs = _merged([x for x in spans if not x[2].startswith("nccl")])
    wall = (max(b for _, b, _ in spans) - spans[0][0]) / calls
    busy = sum(b - a for a, b, _, _ in runs) / calls
    lines = [f"per call: wall {wall / 1e3:.3f} ms, some non-NCCL kernel running "
             f"{busy / 1e3:.3f} ms, idle of them {(wall - busy) / 1e3:.3f} ms",
             "| gap us | after | before | NCCL running then |", "|---|---|---|---|"]
    holes = sorted(((b[0] - a[1], a[3], b[2], a[1], b[0]) for a, b in zip(runs, runs[1:])),
                   reverse=True)
    for width, after, before, lo, hi in holes[:gaps]:
        busy_nccl = sorted({n[:40] for s, e, n in nccl if s < hi and e > lo})
        lines.append(f"| {width:.0f} | {after[:60]} | {before[:60]} | {', '.join(busy_nccl)} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--per-gpu", type=int, default=16384)
    parser.add_argument("--heads", default="32:8:128", help="hq:hkv:head_dim")
    parser.add_argument("--mix", default="uniform")
    parser.add_argument("--layouts", default="whole_docs,pack_zigzag")
    parser.add_argument("--calls", type=int, default=5)
    parser.add_argument("--out", required=True, help="folder for the tables")
    parser.add_argument("--timeline", action="store_true",
                        help="also each rank's trace and its idle stretches")
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
        if args.timeline:
            base = os.path.join(args.out, f"{layout}_rank{rank}")
            prof.export_chrome_trace(base + ".json")
            with open(base.replace(f"_rank{rank}", f"_timeline_rank{rank}") + ".txt", "w") as f:
                f.write(timeline(base + ".json", args.calls) + "\n")
            with open(base + ".json", "rb") as f, gzip.open(base + ".json.gz", "wb") as g:
                shutil.copyfileobj(f, g)
            os.remove(base + ".json")


if __name__ == "__main__":
    main()
