"""LongCA-bench's mask families: burst_attn on the GPUs against the best single-GPU kernel.

    torchrun --nproc-per-node 2 benchmarks/slice_masks.py --out benchmarks/results/h100x2_slice_masks
    python benchmarks/slice_masks.py --cpu-smoke --world 2 --out /tmp/smoke   # gloo, tiny

For every family of ``megatron_burst.plan.mask_families`` (LongCA-bench, arXiv 2510.17896):
GQA 64:8, head dim 128, bf16, 8K tokens per GPU; FLOPs from the visible area (forward
4 x area x heads x d, backward 2.5x that); 5 warm-up and 15 timed calls of each method.
Methods, in one run, on the same mask and inputs:

- ``burst_attn`` over all GPUs (``mask=``, the default 'area' layout), forward alone and
  forward + backward; the backward's time is their difference;
- ``1 GPU package plan``: the same mask's blocks on one GPU (``burst_attn`` on a group of
  one rank: per-slice varlen flash calls, merged in fp32), on rank 0;
- ``1 GPU FlexAttention``: ``flex_attention`` with the block mask of the same mask (built
  from a dense [N, N] bool here, in the benchmark only), compiled once, on rank 0;
- ``PyTorch Flex CP``: PyTorch's own context parallelism for FlexAttention over all GPUs
  (``flex_cp.FlexCP``: K/V all-gathered every call, its mask-aware load balancer), on the
  same mask and inputs (``--no-torch-flex-cp`` leaves it out; off in ``--cpu-smoke``, as
  FlexAttention has no backward on CPU).

Training feeds a new document pack every micro-batch, so for the families whose mask follows
the documents, ``burst fwd+bwd, new pack`` times burst_attn's forward + backward with a new
pack (a new mask, planned at its call) every call, beside the same-mask figure
(``--fresh-kernel torch-flash`` times that row on the flash kernel alone, which builds nothing
per block shape). A call shape that has seen a second, different mask plans every later mask
shape-free (``megatron_burst.attention.varying_masks``: cuDNN builds a graph per new block
shape, which made a new mask cost 0.4-0.5 s a call on 2x H200), so each family starts with
that record cleared, as a model with this one mask would: its same-mask rows plan as a fixed
mask does, and its new-pack row turns shape-free from the first new pack.

Efficiency is burst's TFLOP/s per GPU over the faster single-GPU method's, forward and
backward apart. ``--graph`` also times burst_attn on the same mask captured once in CUDA
graphs and replayed (``captured efficiency``): what is left once the host's share is gone.
Each row also states the area balance: the largest rank's share of the visible area over an
even share (1.00 = perfect), for 'area' and for zigzag.

Document lengths (the families with documents): Pile-like, log-normal with median e^7
(about 1.1K tokens), sigma 1.2, clipped to [16, 12288] (LongCA-bench samples Pile lengths up
to 12K), drawn with a fixed seed per family, the last one cut to fill the sequence. Knobs:
prefix-LM prefix = a quarter of the sequence (of each document for prefix_lm_document:
a quarter of the median), sliding windows w = 1024, global window g = 1024, blocks of 1024
(all scaled down with the sequence in --cpu-smoke).
"""
from __future__ import annotations

import argparse
import datetime
import functools
import logging
import math
import os
import random
import sys
import time
import zlib

import torch
import torch.distributed as dist

# The repo's package after $PYTHONPATH's: a before/after run names the tree it times there.
sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import megatron_burst as mb  # noqa: E402
from megatron_burst.attention import varying_masks  # noqa: E402
from megatron_burst.comm.consensus import from_root  # noqa: E402
from megatron_burst.decide import loads  # noqa: E402
from megatron_burst.plan import mask_families as mf  # noqa: E402
from megatron_burst.plan.mask_placement import rank_areas  # noqa: E402
from flex_cp import FlexCP, dense_mask  # noqa: E402
from host_cores import pin_ranks  # noqa: E402
from ranks import gpu_health, ran_package, spawn_cpu_ranks, start_ranks, write_run  # noqa: E402


def pile_like(total: int, seed: int, scale: float = 1.0) -> tuple[int, ...]:
    """Document lengths filling ``total`` (see the module docstring; ``scale`` shrinks the
    median and the cap with the sequence)."""
    rng, lens = random.Random(seed), []
    cap, floor = max(16, int(12288 * scale)), max(1, int(16 * scale))
    while sum(lens) < total:
        lens.append(max(floor, min(int(rng.lognormvariate(7.0 + math.log(scale), 1.2)), cap)))
    lens[-1] -= sum(lens) - total
    return tuple(n for n in lens if n > 0)


def knobs(total: int, scale: float) -> dict:
    w = max(1, int(1024 * scale))
    return dict(prefix=total // 4, window=w, global_size=w, block=w)


def forget_masks() -> None:
    """The package's memory of masks seen in this process (which shapes' masks vary, and
    'auto''s loads) dropped: the next mask is its shape's first, as in a new run."""
    varying_masks.clear()
    loads.clear()


def family_mask(name: str, total: int, scale: float = 1.0) -> mb.SliceMask:
    """``name``'s mask over ``total`` tokens as this benchmark times it: the first mask its
    call shape sees in the process (``varying_masks``), so large blocks keep cuDNN, and
    'auto' decides it as a fresh run would (``loads``), not from another family's masks.
    ``host_parts.py`` and ``gpu_timeline.py`` take their masks here too: without the reset,
    every family after a run's first went to the flash kernel alone."""
    forget_masks()
    lens = pile_like(total, seed=zlib.crc32(name.encode()), scale=scale)  # same everywhere
    return mf.family(name, lens, **knobs(total, scale))


def sync(dev) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize()


def timed(step, dev, warmup: int, iters: int, align: bool, chained: bool = False) -> float:
    """Mean ms of ``step()`` over ``iters`` calls after ``warmup``; ``align``: the ranks
    meet before each (every rank runs ``step``; not for rank 0's one-GPU methods).
    ``chained``: the ``iters`` calls back to back, synchronised once at the end, as a model's
    layers call attention (the host runs ahead while the GPUs work); else each call is
    synchronised on its own, so its host time before its first kernel is counted."""
    if chained:
        for _ in range(warmup):
            step()
        sync(dev)
        if align:
            dist.barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            step()
        sync(dev)
        return (time.perf_counter() - t0) * 1e3 / iters
    times = []
    for i in range(warmup + iters):
        sync(dev)
        if align:
            dist.barrier()
        t0 = time.perf_counter()
        step()
        sync(dev)
        if i >= warmup:
            times.append((time.perf_counter() - t0) * 1e3)
    return sum(times) / len(times)


def fwd_and_fwdbwd(fn, inputs, do, dev, args, align: bool = False,
                   chained: bool = False) -> tuple[float, float]:
    def forward():
        with torch.no_grad():
            fn(*inputs)

    def both():
        fn(*inputs).backward(do)

    return (timed(forward, dev, args.warmup, args.iters, align, chained),
            timed(both, dev, args.warmup, args.iters, align, chained))


class Flex:
    """``flex_attention`` with a block mask read from one dense bool buffer (rewritten in
    place per mask, so the compiled kernel is made once)."""

    def __init__(self, total: int, dev):
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        self.allowed = torch.zeros(total, total, dtype=torch.bool, device=dev)
        allowed = self.allowed
        self.mask_mod = lambda b, h, q, k: allowed[q, k]
        self.create, self.total, self.dev = create_block_mask, total, dev
        self.attend = torch.compile(flex_attention, dynamic=False)

    def use(self, mask: mb.SliceMask) -> None:
        dense_mask(mask, self.allowed)
        self.block = self.create(self.mask_mod, None, None, self.total, self.total,
                                 device=self.dev)

    def __call__(self, q, k, v):  # [1, s, h, d] -> [1, s, h, d]
        out = self.attend(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                          block_mask=self.block, enable_gqa=True)
        return out.transpose(1, 2)


def new_packs(name: str, total: int, scale: float, count: int) -> list | None:
    """``count`` masks of ``name``, each on a new document pack (seeds after the family's
    own), as training feeds one a micro-batch; None for a family whose mask does not follow
    the documents."""
    base = zlib.crc32(name.encode())
    masks = [mf.family(name, pile_like(total, seed=base + 1 + i, scale=scale),
                       **knobs(total, scale)) for i in range(count)]
    return None if len(set(masks)) == 1 else masks


def fresh_packs(name, args, world, dev, full) -> dict | None:
    """burst_attn fwd+bwd with a new document pack (so a new mask) every call, as training
    feeds them: mean ms and TFLOP/s per GPU over the timed calls, or None for a family whose
    mask does not follow the documents."""
    masks = new_packs(name, args.tokens * world, args.scale, args.warmup + args.iters)
    if masks is None:
        return None
    times, flops = [], 0.0
    for i, mask in enumerate(masks):
        local = [mb.shard_seq(t, mask=mask, layout=args.layout).contiguous() for t in full]
        q, k, v = (t.requires_grad_() for t in local[:3])
        sync(dev)
        dist.barrier()
        t0 = time.perf_counter()
        mb.burst_attn(q, k, v, mask=mask, kernel=args.fresh_kernel or args.kernel,
                      layout=args.layout, backward=args.backward).backward(local[3])
        sync(dev)
        if i >= args.warmup:
            times.append((time.perf_counter() - t0) * 1e3)
            flops += 3.5 * 4.0 * mask.area * args.hq * args.d
    return dict(ms=sum(times) / len(times), tflops=flops / world / sum(times) / 1e9)


def run_family(name, args, world, rank, dev, dtype, solo, flex, flex_cp=None) -> dict:
    total = args.tokens * world
    mask = family_mask(name, total, args.scale)
    lens = pile_like(total, seed=zlib.crc32(name.encode()), scale=args.scale)
    gen = torch.Generator(device=dev).manual_seed(1234)
    full = [torch.randn(1, total, h, args.d, device=dev, dtype=dtype, generator=gen)
            for h in (args.hq, args.hkv, args.hkv, args.hq)]
    local = [mb.shard_seq(t, mask=mask, layout=args.layout).contiguous() for t in full]
    q, k, v = (t.requires_grad_() for t in local[:3])
    flops = 4.0 * mask.area * args.hq * args.d
    def burst(a, b, c):
        return mb.burst_attn(a, b, c, mask=mask, backward=args.backward, layout=args.layout,
                             kernel=args.kernel)

    fwd, both = fwd_and_fwdbwd(burst, (q, k, v), local[3], dev, args, align=True)
    chained = _speed(*fwd_and_fwdbwd(burst, (q, k, v), local[3], dev, args, align=True,
                                     chained=True), flops, world) if args.chained else None
    with mb.count_comm() as sent:  # what one call sends from each rank (each pass), once
        burst(q, k, v).backward(local[3])  # 'auto' has measured and checked its choice
    ranks_sent = [torch.zeros(2, dtype=torch.float64, device=dev) for _ in range(world)]
    dist.all_gather(ranks_sent, torch.tensor([sent.forward_bytes, sent.backward_bytes],
                                             dtype=torch.float64, device=dev))
    ranks_sent = [[round(x / 1e6, 3) for x in t.tolist()] for t in ranks_sent]
    captured = _captured(burst, (q, k, v), local[3], dev, args, flops, world) \
        if args.graph else None
    areas = rank_areas("area", world, total, mask)
    zig = rank_areas("zigzag", world, total, mask)
    row = dict(family=name, slices=len(mask.kinds), documents=len(lens), area=mask.area,
               balance_area=max(areas) / (sum(areas) / world) if sum(areas) else 1.0,
               balance_zigzag=max(zig) / (sum(zig) / world) if sum(zig) else 1.0,
               burst=_speed(fwd, both, flops, world),
               sent_mb=dict(forward=max(f for f, _ in ranks_sent),  # the busiest rank's
                            backward=max(b for _, b in ranks_sent), ranks=ranks_sent),
               burst_fresh=fresh_packs(name, args, world, dev, full))
    if captured is not None:
        row["burst_graph"] = captured
    if chained is not None:
        row["burst_chained"] = chained
    cp_out = None
    if flex_cp is not None:
        row["torch_flex_cp"], cp_out = _torch_flex_cp(flex_cp, mask, full, dev, args, flops,
                                                      world)
    fq, fk, fv = (t.detach().clone().requires_grad_() for t in full[:3])
    with torch.no_grad():  # exactness on the GPUs: burst's output against one GPU's
        got = mb.unshard_seq(mb.burst_attn(*(t.detach() for t in local[:3]), mask=mask,
                                           layout=args.layout),
                             mask=mask, layout=args.layout)
    if rank == 0:
        one = lambda a, b, c: mb.burst_attn(a, b, c, solo, mask=mask)  # noqa: E731
        row["one_gpu_plan"] = _speed(*fwd_and_fwdbwd(one, (fq, fk, fv), full[3], dev, args),
                                     flops, 1)
        if args.chained:
            row["one_gpu_plan_chained"] = _speed(*fwd_and_fwdbwd(
                one, (fq, fk, fv), full[3], dev, args, chained=True), flops, 1)
        with torch.no_grad():
            ref = one(*full[:3]).float()
        row["rel_err_vs_one_gpu"] = float((got.float() - ref).norm() / ref.norm())
        if cp_out is not None:  # the peer held to the same standard
            row["torch_flex_cp"]["rel_err_vs_one_gpu"] = float(
                (cp_out.transpose(1, 2).float() - ref).norm() / ref.norm())
        if flex is not None:
            try:
                flex.use(mask)
                row["one_gpu_flex"] = _speed(*fwd_and_fwdbwd(flex, (fq, fk, fv), full[3], dev,
                                                             args), flops, 1)
                if args.chained:
                    row["one_gpu_flex_chained"] = _speed(*fwd_and_fwdbwd(
                        flex, (fq, fk, fv), full[3], dev, args, chained=True), flops, 1)
            except Exception as err:  # noqa: BLE001  (report it, keep the run)
                row["one_gpu_flex"] = dict(error=f"{type(err).__name__}: {err}"[:200])
        _efficiency(row)
    return row


def _torch_flex_cp(flex_cp: FlexCP, mask, full, dev, args, flops: float, world: int):
    """PyTorch's FlexAttention CP on the same mask and inputs (``flex_cp``: K/V all-gathered,
    its mask-aware load balancer), timed as burst's rows are, its TFLOP/s per GPU; and its
    whole output ([1, h, N, d]), for the exactness check (None where it failed)."""
    try:
        local = flex_cp.shard(mask, full)
        speed = _speed(*fwd_and_fwdbwd(flex_cp, local[:3], local[3], dev, args, align=True),
                       flops, world)
        with torch.no_grad():
            return speed, flex_cp.unshard(flex_cp(*(t.detach() for t in local[:3])))
    except Exception as err:  # noqa: BLE001  (report it, keep the run; the same on every rank)
        return dict(error=f"{type(err).__name__}: {err}"[:200]), None


def _captured(fn, inputs, do, dev, args, flops: float, gpus: int) -> dict:
    """``fn`` (the same mask every call) captured once in CUDA graphs
    (``torch.cuda.make_graphed_callables``, forward and backward) and replayed, timed as the
    eager rows are: what the forward costs once the host's share is gone."""
    try:
        graphed = torch.cuda.make_graphed_callables(fn, tuple(inputs), num_warmup_iters=3)
        return _speed(*fwd_and_fwdbwd(graphed, inputs, do, dev, args, align=True), flops, gpus)
    except Exception as err:  # noqa: BLE001  (report it, keep the run)
        return dict(error=f"{type(err).__name__}: {err}"[:200])


def _speed(fwd_ms: float, both_ms: float, flops: float, gpus: int) -> dict:
    bwd_ms = both_ms - fwd_ms  # not positive only in timing noise (tiny CPU runs)
    return dict(fwd_ms=fwd_ms, fwd_bwd_ms=both_ms,
                fwd_tflops=flops / gpus / fwd_ms / 1e9,
                bwd_tflops=2.5 * flops / gpus / bwd_ms / 1e9 if bwd_ms > 0 else float("nan"),
                fwd_bwd_tflops=3.5 * flops / gpus / both_ms / 1e9)


def _efficiency(row: dict) -> None:
    """burst's TFLOP/s over the faster one-GPU method's; back to back against the one-GPU
    methods timed back to back too (their host time hides behind their kernels as well)."""
    singles = [row[m] for m in ("one_gpu_plan", "one_gpu_flex") if "fwd_tflops" in row.get(m, {})]
    chained = [row[f"{m}_chained"] for m in ("one_gpu_plan", "one_gpu_flex")
               if "fwd_tflops" in row.get(f"{m}_chained", {})]
    for part in ("fwd", "bwd", "fwd_bwd"):
        best = max(s[f"{part}_tflops"] for s in singles)
        row[f"efficiency_{part}"] = row["burst"][f"{part}_tflops"] / best
        if "fwd_tflops" in row.get("burst_graph", {}):
            row[f"efficiency_graph_{part}"] = row["burst_graph"][f"{part}_tflops"] / best
        if chained and "burst_chained" in row:
            row[f"efficiency_chained_{part}"] = row["burst_chained"][f"{part}_tflops"] / max(
                s[f"{part}_tflops"] for s in chained)


def table(meta: dict, rows: list[dict]) -> str:
    """The rows as a Markdown table; a back-to-back column where the run timed it
    (``--chained``), so earlier runs' tables print as they did."""
    back = any("efficiency_chained_fwd" in r for r in rows)
    lines = [f"{meta['device']} x{meta['world']}, torch {meta['torch']}, {meta['date']}, "
             f"{meta['tokens_per_gpu']} tokens/GPU, GQA {meta['heads']}, d {meta['head_dim']}, "
             f"{meta['dtype']}", f"command: `{meta['command']}`", *_pinned(meta), "",
             "| family | slices | balance area / zigzag | burst fwd / bwd TFLOP/s/GPU | "
             "PyTorch Flex CP fwd / bwd | "
             "burst fwd+bwd same mask / new pack | 1 GPU plan fwd / bwd | "
             "1 GPU Flex fwd / bwd | efficiency fwd / bwd | captured efficiency fwd / bwd | "
             + ("back-to-back efficiency fwd / bwd | " if back else "")
             + "rel err | burst fwd / fwd+bwd ms | busiest rank sends fwd / bwd MB |",
             "|" + "---|" * (14 if back else 13)]
    pair = lambda s: (f"{s['fwd_tflops']:.3g} / {s['bwd_tflops']:.3g}"  # noqa: E731
                      if s and "fwd_tflops" in s else (s or {}).get("error", "-")[:40])
    for r in rows:
        eff, graph, chained = (f"{r[f'{e}fwd']:.2f} / {r[f'{e}bwd']:.2f}"
                               if f"{e}fwd" in r else "-"
                               for e in ("efficiency_", "efficiency_graph_",
                                         "efficiency_chained_"))
        if "error" in r.get("burst_graph", {}):
            graph = r["burst_graph"]["error"][:40]
        lines.append(f"| {r['family']} | {r['slices']} | {r['balance_area']:.3f} / "
                     f"{r['balance_zigzag']:.3f} | {pair(r['burst'])} | "
                     f"{pair(r.get('torch_flex_cp'))} | {_fresh(r)} | "
                     f"{pair(r.get('one_gpu_plan'))} | {pair(r.get('one_gpu_flex'))} | {eff} | "
                     f"{graph} | " + (f"{chained} | " if back else "")
                     + f"{r.get('rel_err_vs_one_gpu', float('nan')):.1e} | "
                     f"{r['burst']['fwd_ms']:.3f} / {r['burst']['fwd_bwd_ms']:.3f} | "
                     f"{r['sent_mb']['forward']:.1f} / {r['sent_mb']['backward']:.1f} |")
    return "\n".join(lines)


def _pinned(meta: dict) -> list[str]:
    """The table's line saying where ``--pin-cores`` put the ranks' main threads."""
    pin = meta.get("pinned")
    if not pin:
        return []
    return [f"main threads pinned ({pin['which']}): rank r on CPU {pin['cores']}[r], "
            f"{' / '.join(f'{ms:.1f}' for ms in pin['ms'])} ms at host_cores.python_ms "
            f"(every CPU: {min(pin['every_cpu_ms'].values()):.1f}-"
            f"{max(pin['every_cpu_ms'].values()):.1f})"]


def _fresh(row: dict) -> str:
    """'same / new' fwd+bwd TFLOP/s per GPU ('-' where the mask does not follow documents)."""
    new = row.get("burst_fresh")
    return "-" if not new else f"{row['burst']['fwd_bwd_tflops']:.3g} / {new['tflops']:.3g}"


# The five families whose eager forward one rank's host bounds at 8K tokens per GPU (issue
# 42): the host-time benchmarks' default.
HOST_BOUND = ("block_causal_document,causal_document,causal_blockwise,shared_question,"
              "global_sliding_window")


def add_shape_args(p: argparse.ArgumentParser, families: str) -> None:
    """The families and LongCA-bench's shape (8K tokens a GPU, GQA 64:8, d 128), as every
    mask benchmark takes them."""
    p.add_argument("--families", default=families)
    p.add_argument("--tokens", type=int, default=8192, help="tokens per GPU")
    p.add_argument("--hq", type=int, default=64)
    p.add_argument("--hkv", type=int, default=8)
    p.add_argument("--d", type=int, default=128)


def add_run_args(p: argparse.ArgumentParser) -> None:
    """What the family tables (this one, ``in_layer.py``) take alike: --out, every family
    and LongCA-bench's shape, its 5 warm-up and 15 timed calls, --no-flex, and --cpu-smoke
    with its --world (``smoke_sizes``)."""
    p.add_argument("--out", required=True, help="path prefix: writes OUT.json and OUT.md")
    add_shape_args(p, ",".join(mf.FAMILIES))
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--iters", type=int, default=15)
    p.add_argument("--no-flex", action="store_true", help="leave FlexAttention out")
    p.add_argument("--cpu-smoke", action="store_true",
                   help="gloo on CPU at tiny sizes (spawns --world ranks itself)")
    p.add_argument("--world", type=int, default=2, help="ranks of --cpu-smoke")


def smoke_sizes(args: argparse.Namespace) -> None:
    """A --cpu-smoke run's tiny shape, calls and mask scale (no FlexAttention on CPU)."""
    args.tokens, args.hq, args.hkv, args.d = 64, 4, 2, 16
    args.warmup, args.iters, args.no_flex, args.scale = 1, 2, True, 1 / 64


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_run_args(p)
    p.add_argument("--no-torch-flex-cp", action="store_true",
                   help="leave PyTorch's FlexAttention CP out (no backward on CPU: off there)")
    p.add_argument("--backward", default="auto", choices=("auto", "burst", "ring"),
                   help="burst_attn's backward (default: 'auto', as a user calls it)")
    p.add_argument("--graph", action="store_true",
                   help="also time burst_attn captured in CUDA graphs (GPU only)")
    p.add_argument("--layout", default="area",
                   help="the masks' layout (area, the default; contiguous, zigzag, ...): how "
                        "burst_attn's ranks hold the tokens")
    p.add_argument("--chained", action="store_true",
                   help="also time the eager calls back to back, synchronised once at the "
                        "end, as a model's layers make them (burst and the one-GPU methods)")
    p.add_argument("--kernel", default=None,
                   help="the kernel burst_attn's rows force (e.g. torch-flash: every block on "
                        "flash, packed into the fewest calls); default: the automatic choice. "
                        "The one-GPU methods keep theirs")
    p.add_argument("--fresh-kernel", default=None,
                   help="the kernel the new-pack row forces (e.g. torch-flash, which builds "
                        "nothing per block shape); default: the automatic choice")
    p.add_argument("--pin-cores", default=None, choices=("fast", "slow"),
                   help="each rank's main thread on one of the node's fastest (or slowest) "
                        "CPUs at the host's Python, as host_cores.py times them; default: "
                        "unpinned")
    p.add_argument("--log-auto", action="store_true",
                   help="print 'auto''s decisions (each with its prediction) and its checks")
    args = p.parse_args()
    if args.log_auto:  # the package's INFO lines only, through the root's handler
        logging.basicConfig(format="%(message)s")
        logging.getLogger("megatron_burst").setLevel(logging.INFO)
    args.scale = 1.0
    if args.cpu_smoke and "RANK" not in os.environ:
        return spawn_cpu_ranks(args.world)
    if args.cpu_smoke:
        smoke_sizes(args)
        args.graph = False  # CUDA graphs: GPU only
    # The group (and this rank's GPU, and $MEGATRON_BURST_EMULATE's slowed links) as every
    # GPU benchmark starts them.
    rank, world = start_ranks("gloo") if args.cpu_smoke else start_ranks()
    dev = torch.device("cpu")
    if not args.cpu_smoke:
        dev = torch.device("cuda", torch.cuda.current_device())
    dtype = torch.float32 if args.cpu_smoke else torch.bfloat16
    pinned = (pin_ranks(args.pin_cores, rank, world, functools.partial(from_root, None))
              if args.pin_cores else None)
    solos = [dist.new_group([r]) for r in range(world)]  # a group of one for 1-GPU plans
    flex = None if args.no_flex or rank else Flex(args.tokens * world, dev)
    flex_cp, flex_cp_note = None, None
    if not (args.no_torch_flex_cp or args.cpu_smoke):
        try:
            flex_cp = FlexCP(args.tokens * world, world, dev)
        except (RuntimeError, ValueError) as err:  # the same on every rank: said in meta
            flex_cp_note = str(err)
    health = gpu_health() if rank == 0 else None  # before the run: idle
    rows = [run_family(name, args, world, rank, dev, dtype, solos[rank], flex, flex_cp)
            for name in args.families.split(",")]
    if rank == 0:
        meta = dict(device=torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
                    gpus_before=health, gpus_after=gpu_health(),
                    world=world, torch=torch.__version__, tokens_per_gpu=args.tokens,
                    heads=f"{args.hq}:{args.hkv}", head_dim=args.d, dtype=str(dtype),
                    warmup=args.warmup, iters=args.iters, fresh_kernel=args.fresh_kernel,
                    kernel=args.kernel, pinned=pinned,
                    package=ran_package(),
                    flex_bands=flex_band_signatures(), torch_flex_cp=flex_cp_note or (
                        "on" if flex_cp is not None else "off"),
                    date=datetime.date.today().isoformat(), command=" ".join(sys.argv))
        text = table(meta, rows)
        print(text)
        write_run(args.out, meta, rows, text)
    dist.barrier()  # no rank leaves while rank 0 still writes
    if args.graph:  # NCCL's teardown after CUDA graphs hung on these hosts (2x H100, torch
        torch.cuda.synchronize()  # 2.11; as in host_time.py): every rank leaves together
        os._exit(0)
    dist.destroy_process_group()


def flex_band_signatures() -> list[dict] | None:
    """The band forwards FlexAttention ran on this rank (a package with ``kernels.flex``,
    the trial of commit c97362c): each one's band, query/key rows and whether it passed its
    check; None for a package without it (this one)."""
    try:
        from megatron_burst.kernels.flex import signatures
    except ImportError:
        return None
    return [dict(band=list(key[4:6]), rows=[key[6][0][1], key[7][0][1]], passed=passed)
            for key, passed in signatures().items()]


if __name__ == "__main__":
    main()
