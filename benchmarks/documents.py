"""Packed documents as training feeds them: a new pack every call, against one pack repeated.

    torchrun --nproc_per_node=2 benchmarks/documents.py --per-gpu 8192,16384,32768 \
        --heads 32:8:128,16:4:64 --mixes lognormal,uniform,tiny,long \
        --out benchmarks/results/h200x2_documents_fresh.json

Training hands attention a new pack of documents every micro-batch. For each case (tokens
per GPU, heads, document mix) and each of ``--layouts`` (``whole_docs``: documents placed
and planned on the host; ``pack_zigzag``: the pack placed as one sequence, its documents
read by the GPU; ``pack_zigzag+graph``: that call captured in a CUDA graph once and
replayed on every new pack, ``burst_call``) this times ``burst_attn`` (causal, bf16,
forward + backward) three ways:

- ``new pack each call``: a new pack (seeded) for every call, passed as a new boundaries
  tensor, so nothing made for an earlier pack can be reused; the mean wall time of a call
  with a synchronise after it, so host work counts;
- ``same pack repeated``: each of those packs called again right after (its plans made);
  "new / repeated" is the median over the packs of the two calls' ratio;
- ``new packs back to back``: new packs with no synchronise between calls, as training
  runs them (a call's host work may overlap the GPU work of the call before).

The one-GPU reference runs the whole pack (all GPUs' tokens) on rank 0 with the best
single-GPU kernel on the same fresh packs: PyTorch's varlen flash kernel over the pack in
one call, and, where ``--cudnn-cases`` names the case, cuDNN per document (documents of at
least 128 tokens; the rest in one varlen call) with the graph cuDNN builds for every new
length included, as a new pack pays it. TFLOP/s count the FLOPs actually done: per-document
causal attention, fwd+bwd = 3.5x fwd, summed over the timed packs over their summed time.
Efficiency = burst's TFLOP/s per GPU over the fastest one-GPU kernel's, same packs.
``--[no-]carve-packs``: whether the package's pack plans carve their large documents into
cuDNN cores (``thresholds.CARVE_PACKS``), for an A/B (give ``--warmup`` enough packs to meet
the cores' shapes: each builds a cuDNN graph once); ``--pack-carve-min`` the shortest side
it carves (``thresholds.PACK_CARVE_MIN``). Correctness: the first pack's output
against the reference's, gathered on rank 0.
"host ms" is the time until the call returned (the host's launches; the GPU may still be
busy). Rank 0 writes JSON (with the command, the device and ``$MEGATRON_BURST_EMULATE``,
which emulates slower links between virtual nodes where set: ``ranks.py``), a markdown table
beside it, and a plot.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import sys
import time

import torch
import torch.distributed as dist

import megatron_burst as mb
from megatron_burst import kernels
from megatron_burst.plan.schedule import Block, Mask
from megatron_burst.kernels.varlen import plan_alone, plan_calls
from ranks import EMULATE_ENV, ran_package, start_ranks

MIXES = ("lognormal", "uniform", "tiny", "long")


def pack_lengths(total: int, mix: str, seed: int) -> tuple[int, ...]:
    """Document lengths of one pack of ``total`` tokens (the last document cut to fit).

    lognormal: Llama-3-style pretraining packs, mean 2048 (sigma 1) clipped to 128..16384;
    uniform: 1..4096; tiny: 1..64 (every document stays whole, no K/V should travel);
    long: one document of half the pack among documents of 1..1024, in random order.
    """
    rng, lens = random.Random(seed), []
    if mix == "long":
        lens.append(total // 2)
    held = sum(lens)
    while held < total:
        if mix == "lognormal":
            n = min(16384, max(128, int(rng.lognormvariate(math.log(2048) - 0.5, 1.0))))
        elif mix == "uniform":
            n = rng.randint(1, 4096)
        elif mix == "tiny":
            n = rng.randint(1, 64)
        elif mix == "long":
            n = rng.randint(1, 1024)
        else:
            raise ValueError(f"unknown mix {mix!r}; choose from {MIXES}")
        lens.append(n)
        held += n
    lens[-1] -= sum(lens) - total
    lens = [n for n in lens if n]
    if mix == "long":
        rng.shuffle(lens)
    return tuple(lens)


def boundaries(lens: tuple[int, ...]) -> torch.Tensor:
    out = [0]
    for n in lens:
        out.append(out[-1] + n)
    return torch.tensor(out, dtype=torch.int32)


def causal_flops(lens: tuple[int, ...], hq: int, d: int) -> float:
    """Forward FLOPs of per-document causal attention (visible pairs x 4 x hq x d)."""
    return 4.0 * hq * d * sum(n * (n + 1) / 2 for n in lens)


class _Reference(torch.autograd.Function):
    """The whole pack on one GPU: ``kernel`` runs ``calls`` (raw kernels, no ring)."""

    @staticmethod
    def forward(ctx, q, k, v, kernel, calls, scale):
        out = torch.empty_like(q)
        lse = torch.empty(q.shape[1], q.shape[0], dtype=torch.float32, device=q.device)
        for call in calls:
            if call.varlen:
                a, b = call.q_runs[0][0], call.q_runs[-1][1]  # one contiguous run here
                o, o_lse = kernel.varlen.forward_varlen(q[a:b], k[a:b], v[a:b], call, scale)
                out[a:b], lse[:, a:b] = o, o_lse
            else:
                blk = call.blocks[0]
                o, o_lse = kernel.forward(q[None, blk.q], k[None, blk.k], v[None, blk.k], blk,
                                          scale)
                out[blk.q], lse[:, blk.q] = o[0], o_lse[0]
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.kernel, ctx.calls, ctx.scale = kernel, calls, scale
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        dout = dout.contiguous()
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        for call in ctx.calls:
            if call.varlen:
                a, b = call.q_runs[0][0], call.q_runs[-1][1]
                g = ctx.kernel.varlen.backward_varlen(dout[a:b], q[a:b], k[a:b], v[a:b],
                                                      out[a:b], lse[:, a:b], call, ctx.scale)
                dq[a:b], dk[a:b], dv[a:b] = g
            else:
                blk = call.blocks[0]
                g = ctx.kernel.backward(dout[None, blk.q], q[None, blk.q], k[None, blk.k],
                                        v[None, blk.k], out[None, blk.q], lse[None, :, blk.q],
                                        blk, ctx.scale)
                dq[blk.q], dk[blk.k], dv[blk.k] = (t[0] for t in g)
        return dq, dk, dv, None, None, None


def reference_calls(lens: tuple[int, ...], per_document: bool, device) -> tuple:
    """One varlen call over every document (planned from the boundaries, as cheaply as a
    single GPU can), or (``per_document``) one dense call per document of at least 128
    tokens and one varlen call for the rest."""
    if not per_document:
        calls = plan_alone(lens, Mask(causal=True))
        for c in calls:
            c.cu_tensors(device)
        return calls
    blocks, a = [], 0
    for n in lens:
        blocks.append(Block(a, a + n, a, a + n, "causal"))
        a += n
    big = [b for b in blocks if b.q_stop - b.q_start >= 128]
    small = [b for b in blocks if b.q_stop - b.q_start < 128]
    calls = tuple(c for c in plan_calls(big, varlen=False, dense_min_area=0))
    if small:  # the small ones in contiguous groups, one varlen call each
        groups, cur = [], [small[0]]
        for b in small[1:]:
            if b.q_start == cur[-1].q_stop:
                cur.append(b)
            else:
                groups.append(cur)
                cur = [b]
        groups.append(cur)
        calls += tuple(c for g in groups for c in plan_calls(
            g, varlen=True, dense_min_area=float("inf"), shape_free=True))
    for c in calls:
        if c.varlen:
            c.cu_tensors(device)
    return calls


def wall_ms(step, iters: int, profile=None, warmup: int = 0
            ) -> tuple[list[float], list[float]]:
    """Wall time of each ``step(i)`` with the ranks aligned before and a sync after, and
    the host's share: the time until ``step`` returned (the launches, not the GPU work)."""
    wall, host = [], []
    for i in range(iters):
        torch.cuda.synchronize()
        dist.barrier()
        on = profile is not None and i >= warmup
        if on:
            profile.enable()
        t0 = time.perf_counter()
        step(i)
        t1 = time.perf_counter()
        if on:
            profile.disable()
        torch.cuda.synchronize()
        wall.append((time.perf_counter() - t0) * 1e3)
        host.append((t1 - t0) * 1e3)
    return wall, host


def run_case(args, per_gpu: int, hq: int, hkv: int, d: int, mix: str, world: int,
             rank: int) -> list[dict]:
    dev = torch.device("cuda", torch.cuda.current_device())
    total, n = per_gpu * world, args.iters + args.warmup
    packs = [pack_lengths(total, mix, seed=1000 * per_gpu + i) for i in range(n)]
    later = [pack_lengths(total, mix, seed=1000 * per_gpu + n + i) for i in range(n)]
    gen = torch.Generator(device=dev).manual_seed(7 + rank)
    local = [torch.randn(1, per_gpu, h, d, device=dev, dtype=torch.bfloat16, generator=gen)
             for h in (hq, hkv, hkv, hq)]
    q, k, v = (t.requires_grad_() for t in local[:3])
    do = local[3]
    flops = [3.5 * causal_flops(p, hq, d) for p in packs]
    meta = dict(gpus=world, per_gpu=per_gpu, heads=f"{hq}:{hkv}", head_dim=d, mix=mix,
                docs=statistics.median(len(p) for p in packs))
    rows = []
    for layout in args.layouts.split(","):
        call, cus, later_cus = burst_call(layout, q, k, v, packs, later, dev)
        prof = None
        if rank == 0 and f"{per_gpu}:{hq}:{mix}" in args.pyprofile.split(","):
            import cProfile
            prof = cProfile.Profile()
        rows += timed_rows(args, layout, lambda cu: call(cu).backward(do), cus, later_cus,
                           flops, [3.5 * causal_flops(p, hq, d) for p in later], meta, world,
                           prof)
    rows += reference_rows(args, packs, q, k, v, do, world, rank, meta, flops, mix, per_gpu,
                           hq, hkv, d)
    return rows


def padded(cu: torch.Tensor, count: int) -> torch.Tensor:
    """Boundaries padded to ``count`` entries by repeating the last (empty documents)."""
    return torch.cat((cu, cu[-1:].expand(count - len(cu))))


def burst_call(layout: str, q, k, v, packs, later, dev):
    """(a call of ``burst_attn`` on boundaries, the timed packs' boundaries, the later ones').

    ``whole_docs``: host boundaries, as that layout reads them on the host. ``pack_zigzag``:
    boundaries on the GPU (the data path puts them there), padded to one count per case, so
    one plan serves every pack; ``pack_zigzag+graph``: the same call captured once with
    ``torch.cuda.make_graphed_callables`` (three eager warm-ups, then a CUDA graph of its
    forward and backward) and replayed on every pack, its boundaries a graph input."""
    if layout == "whole_docs":
        return ((lambda cu: mb.burst_attn(q, k, v, causal=True, layout="whole_docs",
                                          cu_seqlens=cu)),
                [boundaries(p) for p in packs], [boundaries(p) for p in later])
    count = -(-max(len(p) + 1 for p in packs + later) // 8) * 8
    cus, later_cus = ([padded(boundaries(p), count).to(dev) for p in group]
                      for group in (packs, later))

    def eager(q, k, v, cu):
        return mb.burst_attn(q, k, v, causal=True, layout="pack_zigzag", cu_seqlens=cu)

    if layout == "pack_zigzag":
        return (lambda cu: eager(q, k, v, cu)), cus, later_cus
    if layout != "pack_zigzag+graph":
        raise ValueError(f"--layouts: unknown {layout!r}")
    graphed = torch.cuda.make_graphed_callables(eager, (q, k, v, cus[0].clone()),
                                                num_warmup_iters=3)
    return (lambda cu: graphed(q, k, v, cu)), cus, later_cus


def timed_rows(args, layout, burst, cus, later, flops, later_flops, meta, world, prof
               ) -> list[dict]:
    """The three timings of one layout (see the module docstring)."""
    # Each pack twice in a row: its first call is a new pack, its second the same pack again.
    n = len(cus)
    both = wall_ms(lambda i: burst(cus[i // 2]), 2 * n, prof, 2 * args.warmup)
    fresh = tuple(x[0::2] for x in both)
    repeated = tuple(x[1::2] for x in both)
    if prof is not None:  # where the host's time goes, by function (both kinds of call)
        import pstats
        print(f"## host profile, {meta} {layout}")
        pstats.Stats(prof).sort_stats("tottime").print_stats(25)
        pstats.Stats(prof).sort_stats("cumulative").print_stats(50)
    # As training runs: new packs back to back, no synchronise between calls, so a call's
    # host work may overlap the GPU work of the one before.
    torch.cuda.synchronize()
    dist.barrier()
    t0 = time.perf_counter()
    for cu in later[args.warmup:]:
        burst(cu)
    torch.cuda.synchronize()
    pipelined_ms = (time.perf_counter() - t0) * 1e3 / args.iters
    rows = []
    timed = flops[args.warmup:]
    for name, (wall, host) in ((f"burst {layout}, new pack each call", fresh),
                               (f"burst {layout}, same pack repeated", repeated)):
        wall, host = wall[args.warmup:], host[args.warmup:]
        ms = sum(wall) / len(wall)
        rows.append(dict(meta, method=name, ms=ms, ms_max=max(wall),
                         host_ms=sum(host) / len(host),
                         tflops_per_gpu=sum(timed) / world / sum(wall) / 1e9))
    rows[0]["fresh_over_repeated"] = statistics.median(
        a / b for a, b in zip(fresh[0][args.warmup:], repeated[0][args.warmup:]))
    rows.append(dict(meta, method=f"burst {layout}, new packs back to back (no sync)",
                     ms=pipelined_ms, tflops_per_gpu=sum(later_flops[args.warmup:]) / world
                     / (pipelined_ms * args.iters) / 1e9))
    return rows


def reference_rows(args, packs, q, k, v, do, world, rank, meta, flops, mix, per_gpu, hq,
                   hkv, d) -> list[dict]:
    """The one-GPU kernels on the same fresh packs (rank 0), and the error check."""
    dev = q.device
    total = per_gpu * world
    ker = kernels.select_kernel(q, k)
    scale = d ** -0.5
    full = [torch.randn(total, h, d, device=dev, dtype=torch.bfloat16,
                        generator=torch.Generator(device=dev).manual_seed(99))
            for h in (hq, hkv, hkv, hq)]
    fq, fk, fv = (t.requires_grad_() for t in full[:3])
    fdo = full[3]
    cases = [("1 GPU varlen flash, new pack each call", False, len(packs)),
             ("1 GPU varlen kernel alone (pack planned before)", None, len(packs))]
    if f"{per_gpu}:{hq}:{mix}" in args.cudnn_cases.split(","):
        cases.append(("1 GPU cuDNN per document, new pack each call", True,
                      min(len(packs), args.warmup + 3)))
    planned = [reference_calls(p, False, dev) if rank == 0 else None for p in packs]
    rows = []
    for name, per_doc, n in cases:
        times = []
        for i in range(n):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            if rank == 0:  # per_doc None: the kernel alone, its plan made before the clock
                calls = planned[i] if per_doc is None else reference_calls(packs[i], per_doc,
                                                                           dev)
                _Reference.apply(fq, fk, fv, ker, calls, scale).backward(fdo)
            torch.cuda.synchronize()
            times.append((time.perf_counter() - t0) * 1e3)
        dist.barrier()
        times = times[args.warmup:] if n > args.warmup else times
        fl = flops[args.warmup:args.warmup + len(times)]
        rows.append(dict(meta, method=name, gpus=1, ms=sum(times) / len(times),
                         tflops_per_gpu=sum(fl) / sum(times) / 1e9))
    for layout in sorted({x.split("+")[0] for x in args.layouts.split(",")}):
        rows.append(dict(meta, method=f"rel err vs 1 GPU ({layout}, first pack, out)",
                         rel_err=check_error(packs[0], full, layout, ker, scale)))
    return rows


def check_error(lens, full, layout, ker, scale) -> float:
    """burst's output on the first pack against the one-GPU kernel's, gathered on rank 0."""
    cu = boundaries(lens)
    with torch.no_grad():
        ql, kl, vl = (mb.shard_seq(t[None].detach(), layout=layout, cu_seqlens=cu)
                      for t in full[:3])
        out = mb.burst_attn(ql, kl, vl, causal=True, layout=layout,
                            cu_seqlens=cu.to(ql.device))
        got = mb.unshard_seq(out, layout=layout, cu_seqlens=cu)[0]
        calls = reference_calls(lens, False, out.device)
        ref = _Reference.apply(*(t.detach() for t in full[:3]), ker, calls, scale)
    return float(((got.float() - ref.float()).norm() / ref.float().norm()).item())


def efficiency(rows: list[dict]) -> None:
    """Each burst row's TFLOP/s per GPU over the fastest one-GPU row's, same case."""
    key = lambda r: (r["per_gpu"], r["heads"], r["mix"])  # noqa: E731
    best_tflops = {}  # FLOPs per second, so packs of different work compare fairly
    for r in rows:
        if r["method"].startswith("1 GPU"):
            best_tflops[key(r)] = max(best_tflops.get(key(r), 0.0), r["tflops_per_gpu"])
    for r in rows:
        if r["method"].startswith("burst") and key(r) in best_tflops:
            r["efficiency_vs_1gpu"] = r["tflops_per_gpu"] / best_tflops[key(r)]


def table(meta: dict, rows: list[dict]) -> str:
    lines = [f"{meta['device']} x{meta['gpus']}, torch {meta['torch']}, {meta['date']}",
             f"command: `{meta['command']}`", "",
             "| tok/GPU | heads | mix | docs | method | ms | host ms | TFLOP/s/GPU | "
             "efficiency vs 1 GPU | new / repeated | rel err |", "|" + "---|" * 11]
    f = lambda r, k, fmt: fmt.format(r[k]) if k in r else "-"  # noqa: E731
    for r in rows:
        lines.append(f"| {r['per_gpu']} | {r['heads']}x{r['head_dim']} | {r['mix']} | "
                     f"{r['docs']:.0f} | {r['method']} | {f(r, 'ms', '{:.2f}')} | "
                     f"{f(r, 'host_ms', '{:.2f}')} | "
                     f"{f(r, 'tflops_per_gpu', '{:.0f}')} | "
                     f"{f(r, 'efficiency_vs_1gpu', '{:.2f}')} | "
                     f"{f(r, 'fresh_over_repeated', '{:.2f}')} | {f(r, 'rel_err', '{:.1e}')} |")
    return "\n".join(lines) + "\n"


def plot(rows: list[dict], path: str) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax = plt.subplots(figsize=(9, 4.5))
    cases = [r for r in rows if "new pack each" in r["method"] and r["method"].startswith("burst")]
    labels = [f"{r['per_gpu'] // 1024}K {r['heads']} {r['mix']} {r['method'].split(',')[0][6:]}"
              for r in cases]
    ax.bar(range(len(cases)), [r.get("efficiency_vs_1gpu", 0) for r in cases])
    ax.set_xticks(range(len(cases)), labels, rotation=75, fontsize=7)
    ax.axhline(1.0, color="grey", lw=0.5)
    ax.set_ylabel("new pack: efficiency vs 1 GPU")
    ax.set_title("burst_attn, a new document pack every call")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def parse_args() -> argparse.Namespace:
    """The run's arguments; the package's carving switches it names set before any plan."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--per-gpu", default="8192,16384,32768")
    parser.add_argument("--heads", default="32:8:128,16:4:64", help="hq:hkv:head_dim,...")
    parser.add_argument("--mixes", default=",".join(MIXES))
    parser.add_argument("--iters", type=int, default=12)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--cudnn-cases", default="16384:16:lognormal,32768:32:lognormal",
                        help="per_gpu:hq:mix cases that also time cuDNN per document")
    parser.add_argument("--pyprofile", default="",
                        help="per_gpu:hq:mix cases whose new-pack calls rank 0 profiles (cProfile)")
    parser.add_argument("--layouts", default="whole_docs",
                        help="whole_docs, pack_zigzag, pack_zigzag+graph (comma-separated)")
    parser.add_argument("--carve-packs", action=argparse.BooleanOptionalAction, default=None,
                        help="whether a pack's plan carves its large documents into cuDNN "
                             "cores (default: the package's, thresholds.CARVE_PACKS)")
    parser.add_argument("--pack-carve-min", type=int, default=None,
                        help="a carving pack's shortest carved side in rows (default: the "
                             "package's, thresholds.PACK_CARVE_MIN)")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    if args.pack_carve_min is not None and args.pack_carve_min < 1:
        parser.error(f"--pack-carve-min must be at least 1 row, got {args.pack_carve_min}")
    if args.carve_packs is not None:  # before any plan key is made
        kernels.thresholds.CARVE_PACKS = args.carve_packs
    if args.pack_carve_min is not None:
        kernels.thresholds.PACK_CARVE_MIN = args.pack_carve_min
    return args


def main() -> None:
    args = parse_args()
    rank, world = start_ranks()
    rows = []
    for per_gpu in (int(x) for x in args.per_gpu.split(",")):
        for hq, hkv, d in (tuple(map(int, h.split(":"))) for h in args.heads.split(",")):
            for mix in args.mixes.split(","):
                t0 = time.time()
                case = run_case(args, per_gpu, hq, hkv, d, mix, world, rank)
                rows += case
                if rank == 0:
                    print(f"# {per_gpu}/gpu {hq}:{hkv}x{d} {mix} ({time.time() - t0:.0f}s): "
                          + "; ".join(f"{r['method']}: {r.get('ms', r.get('rel_err', 0)):.3g}"
                                      for r in case), flush=True)
                torch.cuda.empty_cache()
    if rank == 0:
        efficiency(rows)
        meta = dict(command=" ".join(["torchrun", f"--nproc_per_node={world}"] + sys.argv),
                    device=torch.cuda.get_device_name(0), gpus=world, torch=torch.__version__,
                    date=time.strftime("%Y-%m-%d %H:%M:%S"),
                    emulate=os.environ.get(EMULATE_ENV), carve_packs=args.carve_packs,
                    pack_carve_min=kernels.thresholds.PACK_CARVE_MIN,
                    package=ran_package())
        with open(args.out, "w") as f:
            json.dump(dict(meta=meta, rows=rows), f, indent=1)
        md = table(meta, rows)
        with open(os.path.splitext(args.out)[0] + ".md", "w") as f:
            f.write(md)
        plot(rows, os.path.splitext(args.out)[0] + ".png")
        print(md)
    # With NCCL calls captured in graphs, the teardown hung (2x H200, torch 2.11): the
    # process exit frees them. The package's own replay graphs it drops first (since
    # 2026-11-26, ``attention.replay``), but a package from before did not.
    if "graph" not in args.layouts and os.environ.get("MEGATRON_BURST_REPLAY", "off") == "off":
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
