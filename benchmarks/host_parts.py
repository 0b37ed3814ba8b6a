"""Where an eager slice-mask forward's host time goes: each part's wall time per call.

    torchrun --nproc_per_node=2 benchmarks/host_parts.py --out $OUT/host_parts
    python benchmarks/host_parts.py --cpu-smoke --out /tmp/host_parts   # 2 gloo ranks, tiny

At 8K tokens per GPU the document families with many slices run their eager forward
below 0.75 of one GPU even back to back, while captured in CUDA graphs they reach it
(``slice_masks.py``): the host's share. This times, on every rank, the package's host-side
parts of ``burst_attn``'s forward (no grad; the masks and inputs of ``slice_masks.py``:
GQA 64:8, d 128, bf16), each wrapped by a wall clock for the run: the kernel calls
(``forward_partial``: the attention kernels' launches, a pass's first call included), the
fused merge's Triton launches (``merge._launch``), packing K/V into one message (``Packed.holding``,
``RowShape.gathered``), posting a hop (``PeerComm.post``, inside it ``messages.post_ops``:
the NCCL calls) and waiting for one (``PayloadRing.next``). Nested parts overlap
(``post_ops`` is inside ``PeerComm.post``). Two ways: ``idle`` (the GPUs synchronised and
the ranks aligned before each call: the host's time to reach the last launch) and
``back_to_back`` (20 calls in a row: the host's time per call, beside the wall per call,
which is the GPU's when the host keeps ahead). Every rank's rows: in a ring the rank with
the most host work sets the pace. Not torch.profiler: its own cost per op would be most of
what is measured.
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import functools
import os
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import megatron_burst as mb  # noqa: E402
from megatron_burst.attention import home_output  # noqa: E402
from megatron_burst.comm import messages, rings  # noqa: E402
from megatron_burst.kernels import merge, run_calls  # noqa: E402
from ranks import (family_options, family_run_meta, finish_run, gpu_health,  # noqa: E402
                   spawn_cpu_ranks, start_ranks)
from slice_masks import family_mask  # noqa: E402

# (owner, attribute, its name in the table): the parts timed. Each is looked up through its
# owner at every call in the package (a module global or a class attribute), so wrapping it
# there times every call; a module that imported a part by name is its owner too (a pass's
# first call, ``home_output``, runs its kernel through its own name for forward_partial).
PARTS = ((run_calls, "forward_partial", "kernel calls"),
         (home_output, "forward_partial", "kernel calls"),
         (merge, "_launch", "merge launches"),
         (messages.Packed, "holding", "pack K/V"),
         (rings.RowShape, "gathered", "pack edges"),
         (messages.PeerComm, "post", "post a hop"),
         (messages, "post_ops", "NCCL calls"),
         (rings.PayloadRing, "next", "wait for a hop"))


@contextlib.contextmanager
def timing_parts(parts=PARTS):
    """Within: each part wrapped by a wall clock; yields {name: seconds so far}. Restored
    on exit (a classmethod stays one)."""
    spent: dict[str, float] = collections.defaultdict(float)
    saved = []
    for owner, attr, name in parts:
        raw = owner.__dict__[attr] if isinstance(owner, type) else getattr(owner, attr)
        fn = raw.__func__ if isinstance(raw, classmethod) else raw

        def clocked(*args, _fn=fn, _name=name, **kwargs):
            t0 = time.perf_counter()
            try:
                return _fn(*args, **kwargs)
            finally:
                spent[_name] += time.perf_counter() - t0

        functools.update_wrapper(clocked, fn)
        setattr(owner, attr, classmethod(clocked) if isinstance(raw, classmethod) else clocked)
        saved.append((owner, attr, raw))
    try:
        yield spent
    finally:
        for owner, attr, raw in saved:
            setattr(owner, attr, raw)


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def family_parts(name: str, args, world: int, dev: torch.device, dtype) -> dict:
    """One family's parts on this rank, ms per call, both ways (every rank runs it)."""
    total = args.tokens * world
    mask = family_mask(name, total, args.scale)
    gen = torch.Generator(device=dev).manual_seed(1)
    full = [torch.randn(1, total, h, args.d, device=dev, dtype=dtype, generator=gen)
            for h in (args.hq, args.hkv, args.hkv)]
    q, k, v = (mb.shard_seq(t, mask=mask).contiguous() for t in full)

    def forward():
        with torch.no_grad():
            mb.burst_attn(q, k, v, mask=mask)

    for _ in range(args.warmup):
        forward()
    row = dict(family=name, rank=dist.get_rank(), slices=len(mask.kinds))
    for way in ("idle", "back_to_back"):
        _sync(dev)
        dist.barrier()
        host = 0.0
        with timing_parts() as spent:
            start = time.perf_counter()
            for _ in range(args.iters):
                if way == "idle":
                    _sync(dev)
                    dist.barrier()
                t0 = time.perf_counter()
                forward()
                host += time.perf_counter() - t0
            _sync(dev)
            wall = time.perf_counter() - start
        per = lambda s: s * 1e3 / args.iters  # noqa: E731  (ms per call)
        row[way] = dict(host_ms=per(host), parts_ms={n: per(s) for n, s in spent.items()})
        if way == "back_to_back":
            row[way]["wall_ms"] = per(wall)
    return row


def table(meta: dict, rows: list[dict]) -> str:
    names = list(dict.fromkeys(name for _, _, name in PARTS))
    lines = [f"{meta['device']} x{meta['world']}, torch {meta['torch']}, {meta['date']}, "
             f"{meta['tokens_per_gpu']} tokens/GPU, GQA {meta['heads']}, d {meta['head_dim']}",
             f"command: `{meta['command']}`", "",
             "ms per forward on each rank (idle / back to back); parts nest (NCCL calls are inside"
             " post a hop)", "",
             "| family | rank | slices | host | wall back to back | " + " | ".join(names)
             + " |", "|" + "---|" * (5 + len(names))]
    for r in rows:
        a, b = r["idle"], r["back_to_back"]
        parts = " | ".join(f"{a['parts_ms'].get(n, 0):.3f} / {b['parts_ms'].get(n, 0):.3f}"
                           for n in names)
        lines.append(f"| {r['family']} | {r.get('rank', 0)} | {r['slices']} | {a['host_ms']:.3f} / "
                     f"{b['host_ms']:.3f} | {b['wall_ms']:.3f} | {parts} |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    family_options(p, "causal,causal_document,shared_question,"
                   "causal_blockwise,block_causal_document,sliding_window_causal")
    p.add_argument("--cpu-smoke", action="store_true", help="2 gloo ranks on CPU, tiny sizes")
    args = p.parse_args()
    args.hq, args.hkv, args.d, args.scale = 64, 8, 128, 1.0
    if args.cpu_smoke and "RANK" not in os.environ:
        return spawn_cpu_ranks(2)
    if args.cpu_smoke:
        args.tokens, args.hq, args.hkv, args.d = 64, 4, 2, 16
        args.warmup, args.iters, args.scale = 1, 2, 1 / 64
    rank, world = start_ranks("gloo") if args.cpu_smoke else start_ranks()
    dev = torch.device("cpu") if args.cpu_smoke else torch.device("cuda",
                                                                  torch.cuda.current_device())
    dtype = torch.float32 if args.cpu_smoke else torch.bfloat16
    health = gpu_health() if rank == 0 else None  # before the run: idle
    mine = [family_parts(name, args, world, dev, dtype) for name in args.families.split(",")]
    # every rank's rows: in the ring the rank with the most host work sets the pace
    every: list = [None] * world
    dist.all_gather_object(every, mine)
    dist.barrier()  # (without it a gloo rank could end mid-exchange: std::terminate at exit)
    rows = [r for family in zip(*every) for r in family]  # family by family, rank by rank
    finish_run(rank, args.out, lambda: family_run_meta(
        args, world, dev, health, heads=f"{args.hq}:{args.hkv}", head_dim=args.d), rows, table)


if __name__ == "__main__":
    main()
