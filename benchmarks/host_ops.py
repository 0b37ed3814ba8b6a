"""What a CP=2 call's host time is made of: the building blocks timed alone, and the call
profiled (run with torchrun, 2 GPUs).

    torchrun --nproc_per_node=2 benchmarks/host_ops.py --out benchmarks/results/h100x2_host_ops.json

Part 1 times, on tiny tensors (so the GPU work is negligible), the host cost of each thing a
ring step does: an allocation, a copy, cuDNN's and flash's attention ops (dense and varlen),
the Triton merge launch, a pinned host-to-device copy, an event, and a hop posted through
``dist.batch_isend_irecv`` and through the process group's own coalescing calls (both ranks
in step). Median microseconds of many calls.

Part 2 profiles whole ``burst_attn`` calls (fwd+bwd, 1,024 tokens per rank, bf16, causal):
the plain ring with either backward, and a new ``whole_docs`` pack every call; median host
ms per call, then cProfile's top functions by own time and torch.profiler's top ops by self
CPU time. Rank 0 writes JSON and prints a summary.
"""
from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import statistics
import sys
import time

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile

import megatron_burst as mb

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ranks import host_and_wall_ms, ran_package, start_ranks  # noqa: E402


def per_call_us(fn, n: int = 300) -> float:
    """Median host microseconds of ``fn()`` over ``n`` calls (after 20 warm-up calls)."""
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e6)
    torch.cuda.synchronize()
    return statistics.median(times)


def building_blocks(dev, rank: int) -> dict:
    from megatron_burst.kernels.merge import merge_partial
    from megatron_burst.kernels.varlen import KernelLaunch
    from megatron_burst.kernels.cuda import CudnnAttention, TorchFlashAttention
    from megatron_burst.plan.blocks import Block
    bf = dict(device=dev, dtype=torch.bfloat16)
    q = torch.randn(1, 256, 16, 64, **bf)
    k = torch.randn(1, 256, 4, 64, **bf)
    out32 = torch.randn(1, 256, 16, 64, device=dev)
    lse = torch.randn(1, 16, 256, device=dev)
    blk = Block(0, 256, 0, 256, "causal")
    cudnn, flash = CudnnAttention(), TorchFlashAttention()
    o, o_lse = flash.forward(q, k, k, blk, 0.125)
    import numpy as np
    cu = np.array([0, 100, 256])
    call = KernelLaunch((), True, ((0, 256),), ((0, 256),), cu, cu, (-1, 0), True)
    call.cu_tensors(dev)
    host = torch.tensor([1, 2, 3, 4], dtype=torch.int64)
    res = {
        "torch.empty 1 MB": per_call_us(lambda: torch.empty(1 << 20, dtype=torch.uint8, device=dev)),
        "copy_ 1 MB": per_call_us(lambda: out32.copy_(out32)),
        "narrow + view": per_call_us(lambda: q.narrow(1, 0, 128).view(1, 128, 16, 64)),
        "cuDNN fwd op (256 tok)": per_call_us(lambda: cudnn.forward(q, k, k, blk, 0.125)),
        "flash fwd op (256 tok)": per_call_us(lambda: flash.forward(q, k, k, blk, 0.125)),
        "flash varlen fwd op": per_call_us(lambda: flash.forward_varlen(q[0], k[0], k[0], call, 0.125)),
        "flash bwd op": per_call_us(lambda: flash.backward(q, q, k, k, q, o_lse, blk, 0.125)),
        "triton merge launch": per_call_us(lambda: merge_partial(out32, lse, o, o_lse)),
        "pinned H2D 32 B": per_call_us(lambda: host.pin_memory().to(dev, non_blocking=True)),
        "event record": per_call_us(lambda: torch.cuda.Event().record()),
        "is_current_stream_capturing": per_call_us(torch.cuda.is_current_stream_capturing),
    }
    peer = 1 - rank
    a = torch.empty(1 << 16, dtype=torch.uint8, device=dev)
    b = torch.empty(1 << 16, dtype=torch.uint8, device=dev)
    pg = dist.group.WORLD

    def batch():
        ops = [dist.P2POp(dist.isend, a, peer), dist.P2POp(dist.irecv, b, peer)]
        for w in dist.batch_isend_irecv(ops):
            w.wait()

    def direct():
        pg._start_coalescing(dev)
        pg.send([a], peer, 0)
        pg.recv([b], peer, 0)
        pg._end_coalescing(dev).wait()

    for name, fn in (("hop via batch_isend_irecv + wait", batch),
                     ("hop via pg coalescing + wait", direct)):
        dist.barrier()
        res[name] = per_call_us(fn, 300)
    return res


def call_cases(dev, rank: int, world: int):
    s, hq, hkv, d = 1024, 16, 4, 64
    gen = torch.Generator(device=dev).manual_seed(rank)
    q, k, v = (torch.randn(1, s, h, d, device=dev, dtype=torch.bfloat16, generator=gen)
               .requires_grad_() for h in (hq, hkv, hkv))
    do = torch.randn(1, s, hq, d, device=dev, dtype=torch.bfloat16, generator=gen)
    cpu_gen = torch.Generator().manual_seed(0)

    def new_pack():
        cuts = sorted((torch.randperm(s * world - 1, generator=cpu_gen)[:7] + 1).tolist())
        return torch.tensor([0, *cuts, s * world], dtype=torch.int32)

    return {
        "plain causal, ring bwd": lambda: mb.burst_attn(q, k, v, causal=True,
                                                        backward="ring").backward(do),
        "plain causal, burst bwd": lambda: mb.burst_attn(q, k, v, causal=True,
                                                         backward="burst").backward(do),
        "new whole_docs pack each call": lambda: mb.burst_attn(
            q, k, v, causal=True, layout="whole_docs", cu_seqlens=new_pack()).backward(do),
    }


def posting_breakdown(fn, iters: int) -> dict:
    """Median host microseconds of each process-group call a hop makes, and of the waits,
    inside ``fn`` (wrapped here, in the benchmark: the package is not changed)."""
    from megatron_burst.comm import messages
    times: dict[str, list] = {}

    def timed(name, call):
        def run(*args):
            t0 = time.perf_counter()
            out = call(*args)
            times.setdefault(name, []).append((time.perf_counter() - t0) * 1e6)
            return out
        return run

    real_post, real_wait = messages.post_ops, messages.Batch.wait

    def post_ops(group, device, sends, recvs, resolved=None, peers=()):
        pg, peer, coalesce = resolved or real_process_group(group, device.type)

        class Spy:
            def __getattr__(self, attr):
                return timed(attr, getattr(pg, attr))
        spied = (Spy(), peer, coalesce) if device.type == "cuda" else (pg, peer, coalesce)
        return timed("post_ops", real_post)(group, device, sends, recvs, spied, peers)

    def wait(self):
        return timed("Batch.wait", real_wait)(self)

    real_process_group = messages._process_group
    messages.post_ops, messages.Batch.wait = post_ops, wait
    try:
        for _ in range(iters):
            torch.cuda.synchronize()
            dist.barrier()
            fn()
    finally:
        messages.post_ops, messages.Batch.wait = real_post, real_wait
    return {k: dict(median_us=statistics.median(v), calls=len(v) / iters)
            for k, v in times.items()}


def profile_call(name: str, fn, rank: int, iters: int) -> dict:
    for _ in range(5):
        fn()
    host_ms, wall_ms = host_and_wall_ms(fn, iters)
    prof = cProfile.Profile()
    dist.barrier()
    prof.enable()
    for _ in range(20):
        fn()
    prof.disable()
    torch.cuda.synchronize()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(30)
    calls = sum(st[1] for st in pstats.Stats(prof).stats.values()) / 20
    dist.barrier()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as tp:
        for _ in range(10):
            fn()
        torch.cuda.synchronize()
    table = tp.key_averages().table(sort_by="self_cpu_time_total", row_limit=30)
    return dict(case=name, host_ms=host_ms, wall_ms=wall_ms,
                python_calls=calls, posting=posting_breakdown(fn, iters),
                cprofile=text.getvalue(), torch_profile=table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=30)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    rank, world = start_ranks()
    dev = torch.device("cuda", torch.cuda.current_device())
    blocks = building_blocks(dev, rank)
    calls = [profile_call(n, fn, rank, args.iters) for n, fn in call_cases(dev, rank, world).items()]
    if rank == 0:
        meta = dict(command=" ".join(["torchrun", f"--nproc_per_node={world}"] + sys.argv),
                    device=torch.cuda.get_device_name(0), gpus=world, torch=torch.__version__,
                    date=time.strftime("%Y-%m-%d %H:%M:%S"),
                    package=ran_package())
        with open(args.out, "w") as f:
            json.dump(dict(meta=meta, building_blocks_us=blocks, calls=calls), f, indent=1)
        for c in calls:
            print(f"==== {c['case']}: {c['host_ms']:.3f} ms host, {c['wall_ms']:.3f} ms wall, "
                  f"{c['python_calls']:.0f} Python calls per call; posting: "
                  + ", ".join(f"{k} {v['median_us']:.0f} us x{v['calls']:.1f}"
                              for k, v in c["posting"].items()))
            print(c["cprofile"][:6000])
            print(c["torch_profile"][:5000])
        for n, us in blocks.items():
            print(f"{n:40s} {us:8.1f} us")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
