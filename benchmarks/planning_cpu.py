"""What a new document pack costs the host, on CPU: planning alone, and a whole call.

    python benchmarks/planning_cpu.py --out benchmarks/results/cpu_planning.json

No GPU: two gloo ranks on this machine (spawned), fp32. Two parts:

1. A call with a new pack against the same pack again (issue 33's CPU row): ``burst_attn``
   (whole_docs, causal, 2 ranks x 1,024 tokens, 8:2 heads of dim 16), forward + backward,
   a new pack of documents of 1..300 tokens every call, each then called again; the median
   over the packs of new / same.
2. Planning alone: ``prepare`` of a call with a new pack (validation, placement, schedule,
   the kernel-call plans of both passes), no communication, for packs of 8K and 32K tokens
   of tiny (1..64), uniform (1..4096) and lognormal documents, on 2 and 8 ranks' worth of
   shards (the plan of rank 0), milliseconds per pack.

The same script runs against another checkout (``PYTHONPATH=OLD python ...``) for the
before-and-after figures; the JSON records which package it imported.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import socket
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def pack(total: int, mix: str, seed: int) -> tuple[int, ...]:
    rng, lens = random.Random(seed), []
    while sum(lens) < total:
        if mix == "tiny":
            lens.append(rng.randint(1, 64))
        elif mix == "uniform":
            lens.append(rng.randint(1, 4096))
        elif mix == "short":
            lens.append(rng.randint(1, 300))
        else:
            lens.append(min(16384, max(128, int(rng.lognormvariate(math.log(2048) - 0.5, 1)))))
    lens[-1] -= sum(lens) - total
    return tuple(n for n in lens if n)


def bounds(lens) -> torch.Tensor:
    out = [0]
    for n in lens:
        out.append(out[-1] + n)
    return torch.tensor(out, dtype=torch.int32)


def call_part(rank: int, world: int, iters: int) -> dict:
    import megatron_burst as mb

    torch.manual_seed(rank)
    q, k, v = (torch.randn(1, 1024, h, 16, requires_grad=True) for h in (8, 2, 2))
    do = torch.randn(1, 1024, 8, 16)
    ratios, new_ms, same_ms = [], [], []
    for i in range(iters + 3):
        cu = bounds(pack(1024 * world, "short", seed=i))
        times = []
        for _ in range(2):  # the new pack, then the same pack again
            dist.barrier()
            t0 = time.perf_counter()
            mb.burst_attn(q, k, v, causal=True, layout="whole_docs", cu_seqlens=cu).backward(do)
            times.append(time.perf_counter() - t0)
        if i >= 3:
            ratios.append(times[0] / times[1])
            new_ms.append(times[0] * 1e3)
            same_ms.append(times[1] * 1e3)
    return dict(new_ms=statistics.median(new_ms), same_ms=statistics.median(same_ms),
                new_over_same=statistics.median(ratios))


def planning_part(iters: int) -> list[dict]:
    """prepare() of rank 0 of a pretend group (no communication is made by prepare)."""
    from megatron_burst.attention import prepare

    rows = []
    for world in (2, 8):
        for total in (8192, 32768):
            for mix in ("tiny", "uniform", "lognormal"):
                times, docs = [], []
                for i in range(iters):
                    lens = pack(total * world, mix, seed=7 * i + 1)
                    q = torch.empty(1, total, 8, 64, requires_grad=True)
                    k = torch.empty(1, total, 2, 64, requires_grad=True)
                    cu = bounds(lens)  # the batch's boundaries: made before the clock starts
                    t0 = time.perf_counter()
                    _prepare(prepare, q, k, world, cu)
                    times.append((time.perf_counter() - t0) * 1e3)
                    docs.append(len(lens))
                rows.append(dict(world=world, tokens_per_rank=total, mix=mix,
                                 docs=statistics.median(docs), ms=statistics.median(times)))
                print(rows[-1], flush=True)
    return rows


def _prepare(prepare, q, k, world: int, cu: torch.Tensor) -> None:
    """One new pack's preparation on rank 0 of ``world`` (either package version)."""
    kw = dict(causal=True, softmax_scale=None, window_size=(-1, -1), layout="whole_docs",
              backward="burst", qkv_format="bshd", intra_node_size=None, ulysses_size=1,
              cu_seqlens=cu, kernel=None, keep=None, call_label=None, topology=None)
    if hasattr(prepare, "lookup"):  # this package: a call value, then its preparation
        from megatron_burst.attention.call import BurstCall
        prepare.prepare(q, k, k, None, world, BurstCall.of(kw))
    else:  # the checkout before it: positional options
        order = ("causal", "softmax_scale", "window_size", "layout", "backward", "qkv_format",
                 "intra_node_size", "ulysses_size", "cu_seqlens", "kernel", "keep",
                 "call_label", "topology")
        prepare.prepare(q, k, k, None, world, *(kw[n] for n in order))


def _worker(rank, world, port, iters, out):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    try:
        res = call_part(rank, world, iters)
        if rank == 0:
            out.put(res)
    finally:
        dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=15)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    import megatron_burst

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(r, 2, port, args.iters, out)) for r in range(2)]
    for p in procs:
        p.start()
    call = out.get(timeout=1200)
    for p in procs:
        p.join()
    print("call:", call, flush=True)
    # Planning alone, in this process (prepare treats a group it is not in by its size).
    from unittest import mock

    with mock.patch("torch.distributed.get_rank", return_value=0), \
            mock.patch("torch.distributed.is_initialized", return_value=False):
        rows = planning_part(max(3, args.iters // 3))
    meta = dict(command=" ".join([sys.executable.split("/")[-1], *sys.argv]),
                package=os.path.dirname(megatron_burst.__file__), torch=torch.__version__,
                device="CPU", date=time.strftime("%Y-%m-%d %H:%M:%S"))
    with open(args.out, "w") as f:
        json.dump(dict(meta=meta, call=call, planning=rows), f, indent=1)
    lines = [f"CPU, torch {meta['torch']}, {meta['date']}; package {meta['package']}",
             f"command: `{meta['command']}`", "",
             f"2 gloo ranks x 1,024 tokens, documents 1..300: new pack {call['new_ms']:.2f} ms, "
             f"same pack {call['same_ms']:.2f} ms, new / same {call['new_over_same']:.2f}", "",
             "| ranks | tokens/rank | mix | documents | prepare ms |", "|---|---|---|---|---|"]
    lines += [f"| {r['world']} | {r['tokens_per_rank']} | {r['mix']} | {r['docs']:.0f} | "
              f"{r['ms']:.2f} |" for r in rows]
    with open(os.path.splitext(args.out)[0] + ".md", "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
