"""Whether eager forwards back to back wait on the host or on the GPUs: each rank's trace.

    torchrun --nproc_per_node=2 benchmarks/gpu_timeline.py --out $OUT/timeline

``host_parts.py`` times the host's share of an eager slice-mask forward; this says whether
that share is what the GPUs wait for. For each family (the masks and inputs of
``slice_masks.py``: 8K tokens per GPU, GQA 64:8, d 128, bf16), each rank runs ``--iters``
forwards (no grad) back to back, first untraced (the wall per forward), then under
torch.profiler, and reads its own trace:

- ``busy`` / ``idle``: the time a forward's span has some kernel or copy on the GPU, and
  none (all streams together; NCCL's kernel counts as busy while it waits for its peer);
- ``delay``: each kernel's start after its launch on the host (10th, 50th and 90th
  percentile). Milliseconds mean the host runs that far ahead, and the GPUs are the bound;
  tens of microseconds with idle time mean the GPUs wait on the host;
- ``kernels``: GPU time a forward by kind (attention kernels, merges, copies, NCCL), the
  work each rank does: ranks whose attention time differs wait on each other at the hops.

The profiler's own cost slows the host, so a traced run leans towards the host: a host
ahead under the profiler is ahead without it.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import tempfile
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import megatron_burst as mb  # noqa: E402
from ranks import (family_options, family_run_meta, finish_run, gpu_health,  # noqa: E402
                   start_ranks)
from slice_masks import family_mask  # noqa: E402

# (substring of a kernel's name, its kind), first match wins
KINDS = (("nccl", "nccl"), ("flash_fwd", "flash"), ("cudnn", "cudnn"), ("flex", "flex"),
         ("_merge", "merge"), ("DtoD", "copy DtoD"), ("HtoD", "copy HtoD"),
         ("DtoH", "copy DtoH"), ("Memset", "memset"), ("CatArray", "cat"),
         ("elementwise", "elementwise"))


def kind(name: str) -> str:
    return next((k for key, k in KINDS if key in name), "other")


def read_trace(events: list[dict], calls: int) -> dict:
    """A chrome trace's GPU side, per call of the ``calls`` traced: span, busy and idle ms,
    launch-to-start delays (us), kernels, and GPU us by kind."""
    gpu = sorted((e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")),
                 key=lambda e: e["ts"])
    launches = {e["args"]["correlation"]: e["ts"] for e in events
                if e.get("cat") == "cuda_runtime" and "correlation" in e.get("args", {})}
    if not gpu:
        raise ValueError("gpu_timeline: the trace holds no GPU activity")
    first, busy, end = gpu[0]["ts"], 0.0, gpu[0]["ts"]
    by_kind: collections.Counter = collections.Counter()
    for e in gpu:
        stop = e["ts"] + e["dur"]
        if stop > end:
            busy += stop - max(e["ts"], end)
            end = stop
        by_kind[kind(e["name"])] += e["dur"]
    delays = sorted(e["ts"] - launches[e["args"]["correlation"]] for e in gpu
                    if e.get("args", {}).get("correlation") in launches)
    pick = (lambda q: delays[int(q * (len(delays) - 1))]) if delays else (lambda q: float("nan"))
    span = end - first
    return dict(span_ms=span / 1e3 / calls, busy_ms=busy / 1e3 / calls,
                idle_ms=(span - busy) / 1e3 / calls, delay_us=[pick(q) for q in (.1, .5, .9)],
                kernels=len(gpu) / calls,
                kinds_us={k: v / calls for k, v in by_kind.most_common()})


def family_rows(name: str, args, rank: int, world: int, dev) -> dict:
    """This rank's row of ``name``: the untraced wall per forward, and its trace read."""
    from torch.profiler import ProfilerActivity, profile

    total = args.tokens * world
    mask = family_mask(name, total)
    gen = torch.Generator(device=dev).manual_seed(1)
    q, k, v = (mb.shard_seq(torch.randn(1, total, h, 128, device=dev, dtype=torch.bfloat16,
                                        generator=gen), mask=mask).contiguous()
               for h in (64, 8, 8))

    def forward():
        with torch.no_grad():
            mb.burst_attn(q, k, v, mask=mask)

    for _ in range(args.warmup):
        forward()
    torch.cuda.synchronize()
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(args.iters):
        forward()
    torch.cuda.synchronize()
    wall = (time.perf_counter() - t0) * 1e3 / args.iters
    dist.barrier()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(args.iters):
            forward()
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            events = json.load(f)["traceEvents"]
    return dict(family=name, rank=rank, wall_ms=wall, **read_trace(events, args.iters))


def table(meta: dict, rows: list[dict]) -> str:
    lines = [f"{meta['device']} x{meta['world']}, torch {meta['torch']}, {meta['date']}, "
             f"{meta['tokens_per_gpu']} tokens/GPU, GQA 64:8, d 128, bf16, eager forwards "
             f"back to back", f"command: `{meta['command']}`", "",
             "| family | rank | wall ms | traced span / busy / idle ms | launch to start us "
             "(p10 / p50 / p90) | GPU us a forward by kind |", "|---|---|---|---|---|---|"]
    for r in rows:
        kinds = ", ".join(f"{k} {v:.0f}" for k, v in r["kinds_us"].items())
        lines.append(f"| {r['family']} | {r['rank']} | {r['wall_ms']:.3f} | {r['span_ms']:.3f}"
                     f" / {r['busy_ms']:.3f} / {r['idle_ms']:.3f} | "
                     + " / ".join(f"{x:.0f}" for x in r["delay_us"]) + f" | {kinds} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    family_options(p, "causal_document,shared_question,causal_blockwise,"
                   "block_causal_document")
    args = p.parse_args()
    rank, world = start_ranks()
    dev = torch.device("cuda", torch.cuda.current_device())
    health = gpu_health() if rank == 0 else None
    mine = [family_rows(name, args, rank, world, dev) for name in args.families.split(",")]
    every: list = [None] * world
    dist.all_gather_object(every, mine)
    rows = [r for name in args.families.split(",") for ranks in every for r in ranks
            if r["family"] == name]
    finish_run(rank, args.out, lambda: family_run_meta(args, world, dev, health), rows, table)


if __name__ == "__main__":
    main()
