"""The host's share of a burst_attn call, and what a CUDA graph does to it (run with torchrun).

    torchrun --nproc_per_node=2 benchmarks/host_time.py --out benchmarks/results/h200x2_host_time.json

Two parts, every rank on its own GPU, bf16, causal, fwd+bwd:

1. Host time per call: tensors so small (256 tokens per GPU, 16 heads, d 64) that the GPU
   work is negligible, so the wall time of a call is the host's. For each case (the ring
   with either backward, full attention, a new document pack every call as training feeds
   them; and PyTorch's SDPA on one GPU as the floor) it times the forward and the backward separately: the time until each
   returned ("host") and until the GPU finished ("wall"), median of --iters. The same call
   captured once in a CUDA graph (torch.cuda.make_graphed_callables) and replayed is timed
   the same way.
2. Efficiency at 8K tokens per GPU (MHA 32:32 and GQA 32:8, d 128; and 16:4, d 64): the
   ring eager and graph-replayed against the single-GPU cuDNN kernel on the whole sequence.

Rank 0 writes JSON (command, device) and a markdown table beside it.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import traceback

import torch
import torch.distributed as dist
import torch.nn.functional as F

import megatron_burst as mb

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ranks import EMULATE_ENV, host_and_wall_ms, ran_package, start_ranks  # noqa: E402


def timed(fn, iters: int) -> dict:
    """Median host and wall milliseconds of ``fn()`` (the ranks aligned before each)."""
    host_ms, wall_ms = host_and_wall_ms(fn, iters)
    return dict(host_ms=host_ms, wall_ms=wall_ms)


class Case:
    """One attention call with static inputs, runnable eagerly or graphed."""

    def __init__(self, fn, shapes, dev, seed):
        gen = torch.Generator(device=dev).manual_seed(seed)
        self.inputs = [torch.randn(s, device=dev, dtype=torch.bfloat16, generator=gen,
                                   requires_grad=True) for s in shapes]
        self.do = torch.randn(shapes[0], device=dev, dtype=torch.bfloat16, generator=gen)
        self.fn = fn

    def parts(self, iters: int, graphed: bool = False) -> dict:
        fn = self.fn
        if graphed:
            fn = torch.cuda.make_graphed_callables(self.fn, tuple(self.inputs),
                                                   num_warmup_iters=3)
        for _ in range(3):
            fn(*self.inputs).backward(self.do)
        out_box = []
        fwd = timed(lambda: out_box.append(fn(*self.inputs)), iters)
        bwd_outs = []

        def backward():
            out = fn(*self.inputs)
            torch.cuda.synchronize()
            dist.barrier()
            t0 = time.perf_counter()
            out.backward(self.do)
            bwd_outs.append(time.perf_counter() - t0)

        both = timed(lambda: fn(*self.inputs).backward(self.do), iters)
        for _ in range(iters):
            backward()
        return dict(fwd_host_ms=fwd["host_ms"], fwd_wall_ms=fwd["wall_ms"],
                    bwd_host_ms=statistics.median(bwd_outs) * 1e3,
                    host_ms=both["host_ms"], wall_ms=both["wall_ms"])


def new_packs(total: int):
    """A new pack of four documents for every call, the same on every rank (as a training
    batch gives them), so describing and planning a new pack counts in its host time."""
    gen = torch.Generator().manual_seed(0)
    while True:
        cuts = sorted((torch.randperm(total - 1, generator=gen)[:3] + 1).tolist())
        yield torch.tensor([0, *cuts, total], dtype=torch.int32)


def host_cases(world: int, dev) -> list[tuple[str, object, list]]:
    s, hq, hkv, d = 256, 16, 4, 64
    shapes = [(1, s, hq, d), (1, s, hkv, d), (1, s, hkv, d)]
    packs = new_packs(s * world)
    cases = [
        ("burst causal, burst bwd", lambda q, k, v: mb.burst_attn(q, k, v, causal=True,
                                                                   backward="burst"), shapes),
        ("burst causal, ring bwd", lambda q, k, v: mb.burst_attn(q, k, v, causal=True,
                                                                  backward="ring"), shapes),
        ("burst full, auto bwd", lambda q, k, v: mb.burst_attn(q, k, v), shapes),
    ]
    cases.append(("burst whole_docs, new pack each call (eager only)", lambda q, k, v:
                  mb.burst_attn(q, k, v, causal=True, layout="whole_docs",
                                cu_seqlens=mb.pack_documents(next(packs))), shapes))
    full = [(1, hq, s * world, d)] * 3
    cases.append(("1 GPU SDPA (cuDNN), the whole sequence", cudnn_sdpa, full))
    return cases


def cudnn_sdpa(q, k, v):
    """Causal attention on one GPU with PyTorch's cuDNN kernel ([b, h, s, d])."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def efficiency_cases() -> list[tuple[str, int, int, int]]:
    return [("MHA 32:32 d128", 32, 32, 128), ("GQA 32:8 d128", 32, 8, 128),
            ("GQA 16:4 d64", 16, 4, 64)]


def efficiency_rows(args, n: int, world: int, rank: int, dev) -> list[dict]:
    """The ring eager and graph-replayed at ``n`` tokens per GPU against the single-GPU
    cuDNN kernel on the whole sequence, for each head shape."""
    rows = []
    for name, hq, hkv, d in efficiency_cases():
        shapes = [(1, n, hq, d), (1, n, hkv, d), (1, n, hkv, d)]
        ring = Case(lambda q, k, v: mb.burst_attn(q, k, v, causal=True), shapes, dev, rank)
        eager = ring.parts(args.iters)
        try:
            graph = ring.parts(args.iters, graphed=True)
        except Exception as e:  # noqa: BLE001
            traceback.print_exc()  # the row keeps the start of it; the log, all of it
            graph = dict(error=f"{type(e).__name__}: {str(e)[:300]}")
        # K/V heads expanded to hq: the same FLOPs, on the fastest kernel (cuDNN).
        single = Case(cudnn_sdpa, [(1, hq, n * world, d)] * 3, dev, rank).parts(args.iters)
        for mode, r in (("eager", eager), ("CUDA graph", graph)):
            row = dict(part="efficiency", case=f"causal {name}, {n}/GPU", mode=mode, **r)
            if "wall_ms" in r:
                row["efficiency"] = single["wall_ms"] / (world * r["wall_ms"])
            rows.append(row)
        rows.append(dict(part="efficiency", case=f"causal {name}, {n * world} on 1 GPU",
                         mode="SDPA (cuDNN)", **single))
        if rank == 0:
            print(rows[-3:], flush=True)
        torch.cuda.empty_cache()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=30)
    parser.add_argument("--per-gpu", default="8192",
                        help="tokens per GPU of the efficiency part, comma-separated")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    rank, world = start_ranks()
    dev = torch.device("cuda", torch.cuda.current_device())
    rows = []
    for name, fn, shapes in host_cases(world, dev):
        case = Case(fn, shapes, dev, seed=rank)
        rows.append(dict(part="host", case=name, mode="eager", **case.parts(args.iters)))
        if "eager only" not in name:
            try:
                rows.append(dict(part="host", case=name, mode="CUDA graph",
                                 **case.parts(args.iters, graphed=True)))
            except Exception as e:  # noqa: BLE001  (recorded: a case that cannot be captured)
                traceback.print_exc()
                rows.append(dict(part="host", case=name, mode="CUDA graph",
                                 error=f"{type(e).__name__}: {str(e)[:300]}"))
        if rank == 0:
            print(rows[-2:], flush=True)
    for n in (int(x) for x in args.per_gpu.split(",")):
        rows += efficiency_rows(args, n, world, rank, dev)
    if rank == 0:
        meta = dict(command=" ".join(["torchrun", f"--nproc_per_node={world}"] + sys.argv),
                    device=torch.cuda.get_device_name(0), gpus=world, torch=torch.__version__,
                    date=time.strftime("%Y-%m-%d %H:%M:%S"),
                    emulate=os.environ.get(EMULATE_ENV),
                    package=ran_package())
        with open(args.out, "w") as f:
            json.dump(dict(meta=meta, rows=rows), f, indent=1)
        lines = [f"{meta['device']} x{world}, torch {meta['torch']}, {meta['date']}",
                 f"command: `{meta['command']}`", "",
                 "| part | case | mode | fwd host ms | bwd host ms | fwd+bwd host ms | "
                 "fwd+bwd wall ms | efficiency |", "|---|---|---|---|---|---|---|---|"]
        f = lambda r, k: f"{r[k]:.3f}" if k in r else "-"  # noqa: E731
        for r in rows:
            lines.append(f"| {r['part']} | {r['case']} | {r['mode']} | {f(r, 'fwd_host_ms')} | "
                         f"{f(r, 'bwd_host_ms')} | {f(r, 'host_ms')} | {f(r, 'wall_ms')} | "
                         f"{f(r, 'efficiency') if 'efficiency' in r else r.get('error', '-')[:60]} |")
        with open(os.path.splitext(args.out)[0] + ".md", "w") as fh:
            fh.write("\n".join(lines) + "\n")
        print("\n".join(lines), flush=True)
    # NCCL's teardown after the CUDA graphs hung on these hosts (after the files were
    # written, so earlier runs ended by ``timeout``): every rank leaves together instead.
    dist.barrier()
    torch.cuda.synchronize()
    os._exit(0)


if __name__ == "__main__":
    main()
