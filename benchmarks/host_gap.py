"""Where two calls' times part (run with torchrun on 2 GPUs): 'auto' against its topology
forced on new document packs (the host), and Ulysses against the flat ring (the GPU).

    torchrun --nproc_per_node=2 benchmarks/host_gap.py --out OUT

1. ``auto`` and the topology it chose, forced, each fed a new pack every call (8K tokens a
   GPU, 32:32 heads, d 128, bf16, ``auto_check``'s document mix): the median host and wall
   milliseconds of each, interleaved; then each profiled with cProfile over the same number
   of calls, and the functions whose own time (``tottime``) differs most, per call.
   ``auto_check`` measured auto 0.3-0.57 ms slower on the host than the same topology forced
   on 2x H100 (``results/h100x2_issue41_host``), where CPU gloo ranks show no difference.
2. Ulysses 2 x ring 1 against the flat ring at 8K tokens a GPU, causal, no packs: every CUDA
   kernel's total time over a few calls (``torch.profiler``), and each call's wall, so the
   GPU's own work shows beside the time model's parts (it under-priced Ulysses at 8K by 2-3
   ms in that run).

Rank 0 writes OUT/host_gap.json (command, device, both parts) and prints both tables.
"""
from __future__ import annotations

import argparse
import cProfile
import itertools
import json
import os
import pstats
import statistics
import sys
import time

import torch
import torch.distributed as dist
from torch.profiler import record_function

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from auto_check import doc_lens, pack_order  # noqa: E402
from op_spans import SPAN  # noqa: E402
from ranks import ran_package, start_ranks  # noqa: E402


def inputs(per_gpu: int, heads: tuple[int, int], world: int, device):
    """The whole sequence's q, k, v (bf16, d 128), drawn once."""
    gen = torch.Generator(device="cpu").manual_seed(0)
    return [torch.randn(1, per_gpu * world, h, 128, generator=gen).to(device, torch.bfloat16)
            for h in (heads[0], heads[1], heads[1])]


def pack_caller(full, world: int, device, seed: int = 11):
    """A function that runs one fwd+bwd on the next pack of ``auto_check``'s mix (orders
    drawn by ``seed``), with ``**kw``: (host ms, wall ms), the ranks aligned first."""
    import megatron_burst as mb

    lens, orders = doc_lens(full[0].shape[1]), itertools.count(1)

    def call(**kw):
        order = pack_order(lens, seed, next(orders))
        cu = torch.tensor([0, *itertools.accumulate(order)], dtype=torch.int32)
        q, k, v = (mb.shard_seq(t, layout="whole_docs", cu_seqlens=cu).detach()
                   .requires_grad_() for t in full)
        _sync(device)
        dist.barrier()
        t0 = time.perf_counter()
        with record_function(SPAN):  # what a profile of the caller counts (``op_spans``)
            out = mb.burst_attn(q, k, v, causal=True, layout="whole_docs", cu_seqlens=cu, **kw)
            out.backward(torch.ones_like(out))
        host = time.perf_counter() - t0
        _sync(device)
        return host * 1e3, (time.perf_counter() - t0) * 1e3
    return call


def _sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def auto_against_forced(world: int, device, calls: int) -> dict:
    """Part 1 (module docstring)."""
    from megatron_burst.attention import prepare

    call = pack_caller(inputs(8192, (32, 32), world, device), world, device)
    auto = dict(backward="auto", ulysses_size="auto", intra_node_size="auto")
    for _ in range(3):
        call(**auto)
    chosen = [p for p in prepare.PREPARED.values() if p.decision is not None][-1].topology
    forced = dict(backward=chosen.backward, ulysses_size=chosen.ulysses)
    for _ in range(3):
        call(**forced)
    times = {"auto": [], "forced": []}
    for _ in range(calls):
        for name, kw in (("auto", auto), ("forced", forced)):
            times[name].append(call(**kw))
    own = {}
    for name, kw in (("auto", auto), ("forced", forced)):
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(calls):
            call(**kw)
        prof.disable()
        own[name] = {f"{os.path.basename(f)}:{line}({fn})": (st[1], st[2])
                     for (f, line, fn), st in pstats.Stats(prof).stats.items()}
    diff = sorted(((own["auto"].get(f, (0, 0))[1] - own["forced"].get(f, (0, 0))[1]) / calls,
                   (own["auto"].get(f, (0, 0))[0] - own["forced"].get(f, (0, 0))[0]) / calls, f)
                  for f in set(own["auto"]) | set(own["forced"]))
    return dict(chosen=chosen.describe(),
                host_ms={n: statistics.median(h for h, _ in t) for n, t in times.items()},
                wall_ms={n: statistics.median(w for _, w in t) for n, t in times.items()},
                own_ms_per_call_auto_minus_forced=[
                    dict(function=f, ms=round(d * 1e3, 4), calls=round(c, 2))
                    for d, c, f in diff[::-1][:25] + diff[:5]])


def ulysses_kernels(world: int, device, calls: int) -> dict:
    """Part 2 (module docstring)."""
    import megatron_burst as mb
    from torch.profiler import ProfilerActivity, profile

    full = inputs(8192, (32, 32), world, device)
    q, k, v = (mb.shard_seq(t).detach().requires_grad_() for t in full)
    out = {}
    for name, kw in (("ulysses 2 x ring 1", dict(ulysses_size=2, backward="ring")),
                     ("flat ring 2, ring bwd", dict(ulysses_size=1, backward="ring"))):
        def run():
            o = mb.burst_attn(q, k, v, causal=True, **kw)
            o.backward(torch.ones_like(o))
        for _ in range(3):
            run()
        walls = []
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(calls):
                torch.cuda.synchronize(device)
                dist.barrier()
                t0 = time.perf_counter()
                run()
                torch.cuda.synchronize(device)
                walls.append((time.perf_counter() - t0) * 1e3)
        kernels = sorted(((e.key, e.device_time_total / calls / 1e3, e.count / calls)
                          for e in prof.key_averages() if e.device_time_total > 0),
                         key=lambda x: -x[1])
        out[name] = dict(wall_ms=statistics.median(walls),
                         gpu_ms=sum(ms for _, ms, _ in kernels),
                         kernels=[dict(kernel=n[:90], ms=round(ms, 4), per_call=c)
                                  for n, ms, c in kernels[:14]])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--calls", type=int, default=20)
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    os.environ.setdefault("MEGATRON_BURST_PROFILE_CACHE", os.path.join(args.out, "cache"))
    rank, world = start_ranks()
    device = torch.device("cuda", torch.cuda.current_device())
    result = dict(auto_against_forced=auto_against_forced(world, device, args.calls),
                  ulysses_kernels=ulysses_kernels(world, device, 5))
    if rank == 0:
        meta = dict(command=" ".join(["torchrun", f"--nproc_per_node={world}"] + sys.argv),
                    device=torch.cuda.get_device_name(0), torch=torch.__version__,
                    package=ran_package(), date=time.strftime("%Y-%m-%d %H:%M:%S"))
        with open(os.path.join(args.out, "host_gap.json"), "w") as f:
            json.dump(dict(meta=meta, **result), f, indent=1)
        print(json.dumps(result, indent=1))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
