"""Side-by-side benchmark of exact context-parallel attention methods (run with torchrun).

    torchrun --nproc_per_node=4 benchmarks/attention.py --per-gpu 8192,32768 \
        --heads 32:32,32:8 --masks causal,full --out benchmarks/results/run.json

For each case (tokens per GPU, heads, mask) every method runs forward+backward on the same
inputs; each is timed with CUDA events (median of --iters after --warmup), its peak memory
and bytes sent are recorded, and its output is checked against the single-GPU kernel on
the whole sequence. TFLOP/s count only unmasked FLOPs (fwd+bwd = 3.5x fwd). Efficiency is
per-GPU TFLOP/s over the single-GPU kernel's TFLOP/s on the full sequence (measured in the
same run, capped at --single-cap tokens where the full sequence would take too long).
Rank 0 writes JSON with the command, the device and the MEGATRON_BURST_* environment. With
``$MEGATRON_BURST_EMULATE`` set the links between virtual nodes are emulated (``ranks.py``),
and PyTorch's native CP, whose traffic the emulator cannot slow, is left out.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import baselines  # noqa: E402
from ranks import emulated, ran_package, start_ranks  # noqa: E402
from documents import pack_lengths  # noqa: E402

import megatron_burst as mb  # noqa: E402
from megatron_burst import kernels
from megatron_burst.decide import timing  # noqa: E402
from megatron_burst.decide.scheduled_time import predict_scheduled  # noqa: E402
from megatron_burst.decide.topology import HeadShape  # noqa: E402
from megatron_burst.decide.options import BurstOptions, resolve  # noqa: E402
from megatron_burst.plan.schedule import Block  # noqa: E402

DOC_MIX = (0.40, 0.22, 0.15, 0.10, 0.06, 0.04, 0.02, 0.01)  # "docs": a few long documents
DOC_MASKS = ("docs", "docs-lognormal")


def doc_lens(total: int, mask: str = "docs") -> tuple[int, ...]:
    """Document lengths of the packed sequence.

    ``docs``: a few long documents (40%, 22%, ... 1% of the tokens). ``docs-lognormal``:
    the documents benchmark's Llama-3-style pack (``documents.pack_lengths``, seed 0).
    """
    if mask == "docs":
        lens = [int(total * f) for f in DOC_MIX]
        lens[0] += total - sum(lens)
        return tuple(lens)
    return pack_lengths(total, "lognormal", 0)


def unmasked_pairs(n: int, mask: str) -> float:
    if mask == "full":
        return float(n) * n
    if mask == "causal":
        return n * (n + 1) / 2
    if mask.startswith("window"):
        w = int(mask[len("window"):]) + 1
        return float(w * n - w * (w - 1) / 2) if w < n else n * (n + 1) / 2
    if mask in DOC_MASKS:
        return sum(x * (x + 1) / 2 for x in doc_lens(n, mask))
    raise ValueError(mask)


def time_fwd_bwd(fwd, do, iters: int, warmup: int) -> dict:
    """Median fwd, bwd and total milliseconds of ``fwd().backward(do)``."""
    times = []
    for i in range(warmup + iters):
        e = [torch.cuda.Event(enable_timing=True) for _ in range(3)]
        e[0].record()
        out = fwd()
        e[1].record()
        out.backward(do)
        e[2].record()
        torch.cuda.synchronize()
        if i >= warmup:
            times.append((e[0].elapsed_time(e[1]), e[1].elapsed_time(e[2]),
                          e[0].elapsed_time(e[2])))
    med = [statistics.median(t[j] for t in times) for j in range(3)]
    return dict(fwd_ms=med[0], bwd_ms=med[1], total_ms=med[2])


def whole_sequence_blocks(n: int, mask: str) -> list[Block]:
    """The single-GPU reference's blocks: one per document, band for windows."""
    if mask in DOC_MASKS:
        out, a = [], 0
        for length in doc_lens(n, mask):
            out.append(Block(a, a + length, a, a + length, "causal"))
            a += length
        return out
    if mask.startswith("window"):
        w = int(mask[len("window"):])
        return [Block(0, n, 0, n, "band", -w, 0)] if w < n - 1 else [Block(0, n, 0, n,
                                                                            "causal")]
    return [Block(0, n, 0, n, "causal" if mask == "causal" else "full")]


def run_case(args, per_gpu: int, hq: int, hkv: int, mask: str, world: int, rank: int):
    dev = torch.device("cuda", rank)
    total = per_gpu * world
    d = 128
    gen = torch.Generator(device=dev).manual_seed(per_gpu + hq + hkv)
    q, do = (torch.randn(1, total, hq, d, device=dev, generator=gen, dtype=torch.bfloat16)
             for _ in range(2))
    k, v = (torch.randn(1, total, hkv, d, device=dev, generator=gen, dtype=torch.bfloat16)
            for _ in range(2))
    causal = mask != "full"
    window = (int(mask[len("window"):]), 0) if mask.startswith("window") else (-1, -1)
    cu = None
    docs = mask in DOC_MASKS
    if docs:
        cu = torch.tensor([0, *torch.tensor(doc_lens(total, mask)).cumsum(0).tolist()],
                          dtype=torch.int32)
    flops_fwd = 4 * unmasked_pairs(total, mask) * hq * d
    rows = []

    # The single-GPU kernel on the whole sequence (capped): the efficiency reference and,
    # where uncapped, the correctness reference for every method.
    ref = None
    n1 = min(total, args.single_cap)
    if docs:  # the whole packed sequence in one varlen call on one GPU (never capped)
        n1 = total
    if rank == 0 or n1 == total:
        xs = [t[:, :n1].clone().requires_grad_() for t in (q, k, v)]
        if docs:
            single = lambda: baselines.varlen_attention(*xs, cu.to(dev))  # noqa: E731
            kernel_name = "torch varlen_attn (flash)"
        else:
            blocks = whole_sequence_blocks(n1, mask)
            single = lambda: baselines.local_attention(*xs, blocks)  # noqa: E731
            kernel_name = kernels.select_kernel(q, k).name
        t = time_fwd_bwd(single, do[:, :n1], args.iters, args.warmup)
        if n1 == total:
            with torch.no_grad():
                ref = single().detach()
        f1 = 4 * unmasked_pairs(n1, mask) * hq * d
        rows.append(dict(method="single-gpu kernel", gpus=1, tokens=n1, **t,
                         tflops_per_gpu=3.5 * f1 / t["total_ms"] / 1e9, kernel=kernel_name))
        del xs
    torch.cuda.empty_cache()

    def shard(t, layout="zigzag"):
        return mb.shard_seq(t, layout=layout, cu_seqlens=cu)

    wanted = lambda name: not args.methods or any(m in name for m in args.methods.split(","))  # noqa

    def run(name, fn_of_local, layout="zigzag", topology=None):
        if wanted(name):
            local = [shard(t, layout).requires_grad_() for t in (q, k, v)]
            rows.append(measure(args, name, lambda: fn_of_local(local), shard(do, layout),
                                local, None if ref is None else shard(ref, layout), world,
                                flops_fwd))
            if topology is not None and "error" not in rows[-1]:  # the time model's guess
                rows[-1].update(topology=topology.describe(),
                                predicted_ms=predicted_ms(topology, per_gpu, causal, window))

    if docs:
        run_documents(run, cu, world, hq, hkv)
    else:
        run_sequence(run, causal, window, mask, world, hq, hkv, per_gpu)
    if mask in ("causal", "full"):
        if hq % world == 0 and hkv % world == 0:
            run("ulysses a2a (written here)",
                lambda local: baselines.ulysses_attention(*local, causal))
        run("all-gather KV (written here)",
            lambda local: baselines.allgather_kv_attention(*local, causal))
        if wanted("pytorch native CP (ring)") and not emulated():  # its links: not slowed
            rows.append(measure_native(args, q, k, v, do, ref, causal, world, flops_fwd))
    for r in rows:
        r.update(per_gpu=per_gpu, heads=f"{hq}:{hkv}", mask=mask, world=world)
    return rows


def predicted_ms(topology, per_gpu: int, causal: bool, window: tuple[int, int]) -> float:
    """The time model's fwd+bwd for a plain sequence's call, its window priced as 'auto'
    prices one (``predict_scheduled``); a window's call was priced as the whole causal
    sequence before (33.2 ms for one that ran in 7.8 on 4x H100)."""
    prof = timing.load_profile()
    if window == (-1, -1):
        return timing.predict(topology, prof, tokens=per_gpu, causal=causal).total_s * 1e3
    return predict_scheduled(topology, prof, batch=1, s_local=per_gpu, window=window,
                             causal=causal).total_s * 1e3


def run_sequence(run, causal, window, mask, world, hq, hkv, per_gpu) -> None:
    """burst's topologies on a plain (causal, full or windowed) sequence, and `auto`."""
    burst = {f"burst ({bwd} bwd)": dict(backward=bwd) for bwd in ("auto", "burst", "ring")}
    if world >= 4:  # two simulated "nodes" of world/2 GPUs: 2x2 on 4 GPUs, 2x4 on 8
        burst[f"burst double-ring 2x{world // 2}"] = dict(intra_node_size=world // 2)
    if mask in ("causal", "full"):  # Ulysses inside, ring across (USP): heads permitting
        for u in (2, 4, 8):
            if 1 < u <= world and world % u == 0 and hq % u == 0 and (hkv % u == 0
                                                                         or u % hkv == 0):
                burst[f"burst usp {u}x{world // u} (ulysses x ring)"] = dict(ulysses_size=u)
        burst["burst auto topology (time model)"] = dict(ulysses_size="auto",
                                                         intra_node_size="auto", backward="auto")
    heads = HeadShape(hq, hkv, 128, 2)
    for name, opts in burst.items():
        # The topology burst_attn resolves for these options (the one resolver).
        topology = resolve(BurstOptions(**opts), cp=world, heads=heads, tokens=per_gpu,
                           max_intra_node_size=None, causal=causal)
        run(name, lambda local, opts=opts: mb.burst_attn(
            *local, causal=causal, window_size=window, **opts), topology=topology)


def run_documents(run, cu, world, hq, hkv) -> None:
    """Packed causal documents: burst's whole_docs layout against the TE-style per-document
    zigzag ring and the varlen peers, all with the same varlen flash kernel."""
    for bwd in ("auto", "burst", "ring"):
        run(f"burst whole_docs ({bwd} bwd)", lambda local, bwd=bwd: mb.burst_attn(
            *local, causal=True, layout="whole_docs", cu_seqlens=cu, backward=bwd),
            layout="whole_docs")
    if world >= 4:
        run(f"burst whole_docs double-ring 2x{world // 2}", lambda local: mb.burst_attn(
            *local, causal=True, layout="whole_docs", cu_seqlens=cu,
            intra_node_size=world // 2), layout="whole_docs")
    run("burst per-document zigzag (TE-style)", lambda local: mb.burst_attn(
        *local, causal=True, layout="zigzag", cu_seqlens=cu))
    run("all-gather KV + varlen (torchtitan-style)", lambda local: baselines.allgather_varlen(
        *local, cu, "whole_docs"), layout="whole_docs")
    if hq % world == 0 and hkv % world == 0:
        run("ulysses + varlen", lambda local: baselines.ulysses_varlen(
            *local, cu, "whole_docs"), layout="whole_docs")
def measure(args, name, fn, do_local, params, ref_local, world, flops_fwd) -> dict:
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    try:
        with mb.count_comm() as stats:
            out = fn()
            out.backward(do_local)
        err = float("nan")
        if ref_local is not None:
            err = ((out.float() - ref_local.float()).norm() / ref_local.float().norm()).item()
        fwd_b, bwd_b = stats.forward_bytes, stats.backward_bytes
        t = time_fwd_bwd(fn, do_local, args.iters, args.warmup)
    except Exception as e:  # a peer that cannot run this shape is reported, not fatal
        return dict(method=name, error=f"{type(e).__name__}: {str(e)[:200]}")
    for p in params:
        p.grad = None
    peak = (torch.cuda.max_memory_allocated() - base) / 2**30
    return dict(method=name, gpus=world, **t, tflops_per_gpu=3.5 * flops_fwd / world
                / t["total_ms"] / 1e9, rel_err_vs_single=err, fwd_MiB=fwd_b / 2**20,
                bwd_MiB=bwd_b / 2**20, peak_GiB=peak)


def measure_native(args, q, k, v, do, ref, causal, world, flops_fwd) -> dict:
    """PyTorch native CP: shards its own copies in place, so it gets fresh full tensors."""
    name = "pytorch native CP (ring)"
    hq, hkv = q.shape[2], k.shape[2]
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
        bufs = [t.transpose(1, 2).repeat_interleave(hq // t.shape[2], dim=1).contiguous()
                if t.shape[2] != hq else t.transpose(1, 2).contiguous() for t in (q, k, v, do)]
        expected = None
        if ref is not None:
            expected = ref.transpose(1, 2).contiguous()
            bufs.append(expected)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        with baselines.native_cp(world, bufs, causal):
            lq, lk, lv, ldo = bufs[:4]
            params = [t.detach().requires_grad_() for t in (lq, lk, lv)]
            fn = lambda: baselines.native_sdpa(*params, causal)  # noqa: E731
            used, failures = None, []
            for backend in (SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION):
                try:
                    with sdpa_kernel([backend]):
                        out = fn()
                        out.backward(ldo)
                    used = backend
                    break
                except Exception as e:  # try the next local kernel, remember why
                    failures.append(f"{backend}: {type(e).__name__}: {str(e)[:120]}")
            if used is None:
                raise RuntimeError("; ".join(failures))
            with sdpa_kernel([used]):
                err = float("nan")
                if expected is not None:
                    err = ((out.float() - bufs[4].float()).norm() / bufs[4].float().norm()
                           ).item()
                t = time_fwd_bwd(fn, ldo, args.iters, args.warmup)
        peak = (torch.cuda.max_memory_allocated() - base) / 2**30
        note = "" if hkv == hq else "K/V heads repeated to hq (native CP needs repeat_kv)"
        return dict(method=name, gpus=world, **t, tflops_per_gpu=3.5 * flops_fwd / world
                    / t["total_ms"] / 1e9, rel_err_vs_single=err, peak_GiB=peak,
                    kernel=str(used), note=note)
    except Exception as e:
        return dict(method=name, error=f"{type(e).__name__}: {str(e)[:200]}")


def profile_burst(per_gpu: int, world: int, rank: int, mask: str = "causal",
                  heads: tuple[int, int] = (32, 32)) -> None:
    """Kernel time by kind for burst fwd+bwd (causal MHA, or packed documents in the
    whole_docs layout), and the iteration's wall time against its GPU time, on rank 0."""
    from torch.profiler import ProfilerActivity, profile

    total, (hq, hkv) = per_gpu * world, heads
    opts: dict = dict(causal=True, backward="auto")
    if mask in DOC_MASKS:
        cu = torch.tensor([0, *torch.tensor(doc_lens(total, mask)).cumsum(0).tolist()],
                          dtype=torch.int32)
        opts.update(layout="whole_docs", cu_seqlens=cu)
    shapes = ((1, per_gpu, hq, 128), (1, per_gpu, hkv, 128), (1, per_gpu, hkv, 128))
    q, k, v = (torch.randn(s, device="cuda", dtype=torch.bfloat16, requires_grad=True)
               for s in shapes)
    do = torch.randn_like(q)

    def step():
        mb.burst_attn(q, k, v, **opts).backward(do)

    for _ in range(3):
        step()
    wall = 0.0
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        for _ in range(3):  # ranks start each iteration together, so waits are real ones
            torch.cuda.synchronize()
            dist.barrier()
            t0 = time.perf_counter()
            step()
            torch.cuda.synchronize()
            wall += (time.perf_counter() - t0) / 3 * 1e3
    if rank == 0 and os.environ.get("PYPROFILE"):  # where the host's time goes, by function
        import cProfile
        import pstats
        cpu = cProfile.Profile()
    else:
        cpu = None
    for _ in range(3):
        torch.cuda.synchronize()
        dist.barrier()
        if cpu is not None:
            cpu.enable()
        step()
        if cpu is not None:
            cpu.disable()
    if cpu is not None:
        pstats.Stats(cpu).sort_stats("tottime").print_stats(18)
    if rank == 0:
        events = prof.key_averages()
        gpu_ms = sum(e.self_device_time_total for e in events) / 3 / 1e3
        print(f"## profile: burst {mask} {hq}:{hkv} {per_gpu}/GPU on {world} GPUs: "
              f"{wall:.2f} ms per iteration (with the profiler), GPU busy {gpu_ms:.2f} ms, "
              f"{sum(e.count for e in events if e.device_type.name == 'CUDA') // 3} kernels")
        print(events.table(sort_by="self_cuda_time_total", row_limit=22,
                           max_name_column_width=60))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--per-gpu", default="8192,32768")
    parser.add_argument("--heads", default="32:32,32:8")
    parser.add_argument("--masks", default="causal,full")
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--single-cap", type=int, default=131072)
    parser.add_argument("--out", required=True)
    parser.add_argument("--methods", default="",
                        help="comma-separated substrings: run only the methods whose name has one")
    parser.add_argument("--profile", action="store_true",
                        help="print where burst's time goes (torch profiler) for each case")
    args = parser.parse_args()
    rank, world = start_ranks()
    if args.profile:
        for per_gpu in (int(x) for x in args.per_gpu.split(",")):
            for mask in args.masks.split(","):
                for heads in args.heads.split(","):
                    profile_burst(per_gpu, world, rank, mask, tuple(map(int, heads.split(":"))))
        dist.destroy_process_group()
        return
    rows = []
    for per_gpu in (int(x) for x in args.per_gpu.split(",")):
        for hq, hkv in (tuple(map(int, h.split(":"))) for h in args.heads.split(",")):
            for mask in args.masks.split(","):
                t0 = time.time()
                case = run_case(args, per_gpu, hq, hkv, mask, world, rank)
                rows += case
                if rank == 0:
                    print(f"# {per_gpu}/gpu {hq}:{hkv} {mask} on {world} GPUs "
                          f"({time.time() - t0:.0f}s)", flush=True)
                    for r in case:
                        print("   ", {k: (round(v, 4) if isinstance(v, float) else v)
                                      for k, v in r.items()}, flush=True)
                torch.cuda.empty_cache()
    if rank == 0:
        meta = dict(command=" ".join(["torchrun", f"--nproc_per_node={world}"] + sys.argv),
                    device=torch.cuda.get_device_name(0), gpus=world,
                    torch=torch.__version__,
                    package=ran_package(), date=time.strftime("%Y-%m-%d %H:%M:%S"),
                    profile=timing.load_profile().name,
                    env={k: v for k, v in os.environ.items() if k.startswith("MEGATRON_BURST")})
        with open(args.out, "w") as f:
            json.dump(dict(meta=meta, rows=rows), f, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
