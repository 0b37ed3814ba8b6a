"""The mask families' attention where a model calls it: between a layer's matrix products, eager.

    torchrun --nproc_per_node=2 benchmarks/in_layer.py --out $OUT/in_layer   # ~3-4 min on 2x H200
    python benchmarks/in_layer.py --cpu-smoke --world 2 --out /tmp/smoke   # gloo, tiny

Why: ``slice_masks.py --chained`` calls attention back to back and nothing else. Where one
call's host work (Python, launches, NCCL's posts) outlasts its kernels, the GPU idles between
calls and the host's moment decides the figure; on the lent VMs a CPU runs Python at one
speed or half it (``host_cores.py``). A model calls attention between its layer's matrix
products, which the GPU runs while the host prepares the attention. There an eager call
costs the step its GPU span, and its host time shows only where the host falls behind the
GPU's queue. This times that span, eagerly, on the same masks and inputs as the table.

Each step is one layer's forward and backward on this rank's tokens: the QKV projection;
attention's forward (with grad, as training runs it) between two CUDA events on the current
stream; the output projection and a SwiGLU MLP; their backward (each product's dX and dW);
attention's backward between two more events; the QKV projection's backward. The products
are a Llama-70B layer's at TP=1 (hidden 8,192 = the 64 query heads x 128, 8 KV heads, FFN
28,672), on preallocated operands; their values feed nothing (they occupy the GPU as the
layer does). A span holds whatever the GPU did between its events: the attention's kernels,
its waits for the peer, and any gap where the host had not yet launched the next kernel.

Methods, as ``slice_masks.py`` has them: ``burst_attn`` over all GPUs (the slower rank's
mean span), and on rank 0 the one-GPU plan (``burst_attn`` on a group of one) and
FlexAttention with the same block mask, each in its own layer of the whole sequence's
tokens. Efficiency is the faster one-GPU span over (GPUs x burst's span), forward and
backward apart; the same calls back to back without the layer (``alone``) are timed in the
same run beside it. The GPU is never idle for want of the host inside a span that it had
not yet begun when the host had launched all of it: the table counts those steps
(``ahead``, from a CUDA event's query), and gives the host's time in burst's calls (which
includes waits for room in CUDA's launch queue once the host is far ahead). 5 warm-up and
15 timed steps, synchronised once at the end.

``--new-packs``: a new document pack every step, as training feeds one a micro-batch (the
families with documents only; nothing alone). Each step's calls then run the plans of masks
that follow the data (shape-free) and pay their planning in the step; FlexAttention makes
each pack's block mask in the step, before the layer's products. ``--shape-free-grain`` and
``--[no-]carve-rings`` set how a shape-free plan carves its blocks (``thresholds``), and
``--[no-]cuts-between-slices`` how the area layout cuts (``plan.area.BETWEEN_SLICES``), for an
A/B.
"""
from __future__ import annotations

import argparse
import functools
import math
import os
import statistics
import sys
import time
from typing import Callable

import torch
import torch.distributed as dist

sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import megatron_burst as mb  # noqa: E402
from megatron_burst.kernels import thresholds  # noqa: E402
from megatron_burst.kernels.selection import pick_kernel  # noqa: E402
from megatron_burst.plan import area  # noqa: E402
from ranks import (family_run_meta, finish_run, gpu_health, spawn_cpu_ranks,  # noqa: E402
                   start_ranks)
from slice_masks import (Flex, add_run_args, family_mask, forget_masks,  # noqa: E402
                         new_packs, smoke_sizes)

# A Llama-70B layer at TP=1: hidden = query heads x head dim; FFN 28,672 (SwiGLU's two
# halves in one product), scaled with the hidden size where the shape is not the default.
FFN_PER_HIDDEN = 28672 / 8192


class Linear:
    """One matrix product of the layer on preallocated operands: forward Y = A W, backward
    dA = dY W^T and dW = A^T dY (three products; nothing allocated per call)."""

    def __init__(self, tokens: int, k: int, n: int, dev: torch.device, dtype: torch.dtype):
        new = lambda *s: torch.randn(*s, device=dev, dtype=dtype) / 32  # noqa: E731
        self.a, self.w, self.y = new(tokens, k), new(k, n), new(tokens, n)
        self.dy, self.da, self.dw = new(tokens, n), new(tokens, k), new(k, n)

    def forward(self) -> None:
        torch.mm(self.a, self.w, out=self.y)

    def backward(self) -> None:
        torch.mm(self.dy, self.w.t(), out=self.da)
        torch.mm(self.a.t(), self.dy, out=self.dw)


class Layer:
    """The matrix products around a layer's attention (see the module docstring):
    ``before`` runs ahead of attention's forward, ``middle`` between its forward and its
    backward, ``after`` behind its backward."""

    def __init__(self, tokens: int, hq: int, hkv: int, d: int, dev: torch.device,
                 dtype: torch.dtype):
        hidden = hq * d
        ffn = int(FFN_PER_HIDDEN * hidden)
        make = lambda k, n: Linear(tokens, k, n, dev, dtype)  # noqa: E731
        self.qkv, self.out = make(hidden, (hq + 2 * hkv) * d), make(hidden, hidden)
        self.up, self.down = make(hidden, 2 * ffn), make(ffn, hidden)

    def before(self) -> None:
        self.qkv.forward()

    def middle(self) -> None:
        for lin in (self.out, self.up, self.down):
            lin.forward()
        for lin in (self.down, self.up, self.out):
            lin.backward()

    def after(self) -> None:
        self.qkv.backward()


class Spans:
    """GPU spans between marks on the current stream (CUDA events), or host spans on CPU
    (gloo smoke runs: there the host does the work)."""

    def __init__(self, dev: torch.device):
        self.cuda = dev.type == "cuda"
        self.marks: list = []

    def mark(self) -> int:
        """A mark here; its index."""
        self.marks.append(torch.cuda.Event(enable_timing=True) if self.cuda
                          else time.perf_counter())
        if self.cuda:
            self.marks[-1].record()
        return len(self.marks) - 1

    def ahead(self, i: int) -> bool:
        """Whether the GPU has not yet reached mark ``i``: asked when the host has launched
        everything up to a later mark, so no gap in between waited for the host (always
        true on CPU, where the host does the work)."""
        return not self.marks[i].query() if self.cuda else True

    def between(self, i: int, j: int) -> float:
        """ms from mark ``i`` to mark ``j`` (after the device has finished)."""
        a, b = self.marks[i], self.marks[j]
        return a.elapsed_time(b) if self.cuda else (b - a) * 1e3


def meet(ranks: torch.Tensor | None) -> None:
    """The ranks' streams meet (a one-element all-reduce, on NCCL's stream, that the current
    stream waits for; the host does not): a span then starts with every rank there, as the
    table's calls start after a barrier. Without it, a rank whose matrix products ran longer
    would charge its lateness to its peer's attention span."""
    if ranks is not None:
        dist.all_reduce(ranks)


def sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize()


def fresh_grads(inputs: list) -> None:
    """Drop the inputs' gradients, so a backward stores dq, dk and dv rather than adding them
    to the last step's: training's q, k and v are the QKV projection's outputs, not leaves."""
    for t in inputs:
        t.grad = None


def same(attend: Callable, inputs: list, do: torch.Tensor) -> Callable:
    """``in_layer``'s steps all on one mask: step i's (attend, inputs, do) whatever i."""
    return lambda i: (attend, inputs, do)


def in_layer(pack: Callable, layer: Layer, dev, args, ranks: torch.Tensor | None) -> dict:
    """Mean ms over the timed steps of attention's forward and backward spans inside the
    layer's steps and of the whole step (GPU); the host's ms in each attention call (a call
    may wait there for room in CUDA's launch queue when the host is far ahead); and in how
    many steps the GPU had not yet begun the span when the host had launched all of it
    (``ahead``: then no gap in the span waited for the host). ``ranks``: a one-element
    tensor for the ranks to meet on before each span (None: one GPU). ``pack(i)``: step
    i's (attend, inputs, do): the same every step (``same``) or a new document pack a step
    (``run_new_packs``)."""
    sync(dev)
    if ranks is not None:
        dist.barrier()
    spans, marks, hosts = Spans(dev), [], []
    for i in range(args.warmup + args.iters):  # one stretch: the timed steps find the
        first = spans.mark()                   # GPU's queue as the warm-up left it
        attend, inputs, do = pack(i)
        layer.before()
        meet(ranks)
        f0, t1 = spans.mark(), time.perf_counter()
        out = attend(*inputs)
        t2, f1 = time.perf_counter(), spans.mark()
        went_f = spans.ahead(f0)
        layer.middle()
        fresh_grads(inputs)
        meet(ranks)
        b0, t3 = spans.mark(), time.perf_counter()
        out.backward(do)
        t4, b1 = time.perf_counter(), spans.mark()
        went_b = spans.ahead(b0)
        layer.after()
        marks.append((first, f0, f1, b0, b1, spans.mark()))
        hosts.append(((t2 - t1) * 1e3, (t4 - t3) * 1e3, went_f, went_b))
    sync(dev)
    timed = marks[args.warmup:]
    fwd = [spans.between(f0, f1) for _, f0, f1, _, _, _ in timed]
    bwd = [spans.between(b0, b1) for _, _, _, b0, b1, _ in timed]
    step = [spans.between(first, last) for first, *_, last in timed]
    host_f, host_b, went_f, went_b = zip(*hosts[args.warmup:])
    mean = statistics.fmean
    return dict(fwd_ms=mean(fwd), bwd_ms=mean(bwd), step_gpu_ms=mean(step),
                host_fwd_ms=mean(host_f), host_bwd_ms=mean(host_b),
                ahead_fwd=sum(went_f), ahead_bwd=sum(went_b), steps=len(fwd))


def alone(attend: Callable, inputs: list, do: torch.Tensor, dev, args, align: bool) -> float:
    """Mean ms of attention's forward + backward back to back, without the layer (as
    ``slice_masks.py --chained`` times them), synchronised once at the end."""
    for _ in range(args.warmup):
        fresh_grads(inputs)
        attend(*inputs).backward(do)
    sync(dev)
    if align:
        dist.barrier()
    t0 = time.perf_counter()
    for _ in range(args.iters):
        fresh_grads(inputs)
        attend(*inputs).backward(do)
    sync(dev)
    return (time.perf_counter() - t0) * 1e3 / args.iters


def whole_sequence(args, world: int, dev, dtype) -> list[torch.Tensor]:
    """q, k, v and dout over the whole sequence, the same seeded values in every run."""
    gen = torch.Generator(device=dev).manual_seed(1234)
    return [torch.randn(1, args.tokens * world, h, args.d, device=dev, dtype=dtype,
                        generator=gen) for h in (args.hq, args.hkv, args.hkv, args.hq)]


def leaves(full: list[torch.Tensor]) -> list[torch.Tensor]:
    """The one-GPU methods' q, k, v: copies of the whole sequence's that take gradients."""
    return [t.detach().clone().requires_grad_() for t in full[:3]]


def run_family(name: str, args, world: int, rank: int, dev, dtype, solo, flex,
               layers: dict) -> dict:
    """One family's row: burst's spans on every rank (each rank's own), and on rank 0 the
    one-GPU methods' and the efficiencies."""
    mask = family_mask(name, args.tokens * world, args.scale)
    full = whole_sequence(args, world, dev, dtype)
    local = [mb.shard_seq(t, mask=mask).contiguous() for t in full]
    inputs = [t.requires_grad_() for t in local[:3]]

    def burst(a, b, c):
        return mb.burst_attn(a, b, c, mask=mask)

    ranks = torch.zeros(1, device=dev)
    mine = dict(in_layer=in_layer(same(burst, inputs, local[3]), layers["cp"], dev, args,
                                  ranks),
                alone_ms=alone(burst, inputs, local[3], dev, args, True))
    every = [None] * world
    dist.all_gather_object(every, mine)
    row = dict(family=name, slices=len(mask.kinds), area=mask.area, burst_ranks=every)
    if rank == 0:
        whole = leaves(full)
        one = lambda a, b, c: mb.burst_attn(a, b, c, solo, mask=mask)  # noqa: E731
        methods = {"one_gpu_plan": one}
        if flex is not None:
            flex.use(mask)
            methods["one_gpu_flex"] = flex
        for key, fn in methods.items():
            row[key] = dict(in_layer=in_layer(same(fn, whole, full[3]), layers["one"], dev,
                                              args, None),
                            alone_ms=alone(fn, whole, full[3], dev, args, False))
        efficiencies(row, world)
    dist.barrier()
    return row


def flex_packs(flex, masks: list, whole: list, do: torch.Tensor) -> Callable:
    """FlexAttention's step i: its block mask made for pack i (in the step, before the
    layer's products: as a model makes it once a micro-batch), then the call."""
    def pack(i):
        flex.use(masks[i])
        return flex, whole, do
    return pack


def run_new_packs(name: str, args, world: int, rank: int, dev, dtype, solo, flex,
                  layers: dict) -> dict | None:
    """``name``'s row with a new document pack every step (``--new-packs``), as training
    feeds one a micro-batch: each rank's inputs sharded for each pack beforehand (the data
    loader's work), every step's calls on a new mask, so the timed steps run the plans that
    masks following the data get (shape-free) and pay their planning inside the step. None
    for a family whose mask does not follow the documents."""
    forget_masks()  # the family's first pack is its shape's first mask, as in a run
    masks = new_packs(name, args.tokens * world, args.scale, args.warmup + args.iters)
    if masks is None:
        return None
    full = whole_sequence(args, world, dev, dtype)
    shards = [[mb.shard_seq(t, mask=m).contiguous() for t in full] for m in masks]
    for local in shards:
        for t in local[:3]:
            t.requires_grad_()

    def burst(i):
        return functools.partial(mb.burst_attn, mask=masks[i]), shards[i][:3], shards[i][3]

    mine = dict(in_layer=in_layer(burst, layers["cp"], dev, args, torch.zeros(1, device=dev)))
    every = [None] * world
    dist.all_gather_object(every, mine)
    row = dict(family=name, packs=len(masks), burst_ranks=every)
    if rank == 0:
        whole = leaves(full)
        methods = dict(one_gpu_plan=lambda i: (functools.partial(
            mb.burst_attn, group=solo, mask=masks[i]), whole, full[3]))
        if flex is not None:
            methods["one_gpu_flex"] = flex_packs(flex, masks, whole, full[3])
        for key, pack in methods.items():
            row[key] = dict(in_layer=in_layer(pack, layers["one"], dev, args, None))
        efficiencies(row, world)
    dist.barrier()
    return row


def efficiencies(row: dict, world: int) -> None:
    """The faster one-GPU method's ms over (GPUs x burst's slower rank's ms): in the layer,
    forward and backward apart, and alone, forward + backward."""
    singles = [row[m] for m in ("one_gpu_plan", "one_gpu_flex") if m in row]
    for part in ("fwd", "bwd"):
        burst = max(r["in_layer"][f"{part}_ms"] for r in row["burst_ranks"])
        best = min(s["in_layer"][f"{part}_ms"] for s in singles)
        row[f"efficiency_in_layer_{part}"] = best / (world * burst)
    burst = max(r["in_layer"]["fwd_ms"] + r["in_layer"]["bwd_ms"] for r in row["burst_ranks"])
    best = min(s["in_layer"]["fwd_ms"] + s["in_layer"]["bwd_ms"] for s in singles)
    row["efficiency_in_layer_fwd_bwd"] = best / (world * burst)
    if "alone_ms" in singles[0]:  # not timed with a new pack a step
        row["efficiency_alone_fwd_bwd"] = min(s["alone_ms"] for s in singles) / (
            world * max(r["alone_ms"] for r in row["burst_ranks"]))


def table(meta: dict, rows: list[dict]) -> str:
    """The rows as a Markdown table under the run's device, shape and command."""
    lines = [f"{meta['device']} x{meta['world']}, torch {meta['torch']}, {meta['date']}, "
             f"{meta['tokens_per_gpu']} tokens/GPU, GQA {meta['heads']}, d {meta['head_dim']}, "
             f"{meta['dtype']}; layer: {meta['layer']}"
             + ("; a new document pack every step" if meta.get("new_pack_every_step") else ""),
             f"command: `{meta['command']}`", "",
             "| family | burst in layer fwd / bwd ms (slower rank) | 1 GPU plan fwd / bwd ms | "
             "1 GPU Flex fwd / bwd ms | efficiency in layer fwd / bwd / both | "
             "efficiency alone fwd+bwd | steps the host was ahead fwd / bwd (the rank with "
             "fewer) | "
             "burst host fwd / bwd ms (slower rank) |", "|---" * 8 + "|"]
    for r in rows:
        ranks = r["burst_ranks"]
        slow = lambda key: max(x["in_layer"][key] for x in ranks)  # noqa: E731
        few = lambda key: min(x["in_layer"][key] for x in ranks)  # noqa: E731
        pair = lambda s: ("-" if s is None else  # noqa: E731
                          f"{s['in_layer']['fwd_ms']:.3f} / {s['in_layer']['bwd_ms']:.3f}")
        steps = ranks[0]["in_layer"]["steps"]
        lines.append(
            f"| {r['family']} | {slow('fwd_ms'):.3f} / {slow('bwd_ms'):.3f} | "
            f"{pair(r.get('one_gpu_plan'))} | {pair(r.get('one_gpu_flex'))} | "
            f"{r['efficiency_in_layer_fwd']:.2f} / {r['efficiency_in_layer_bwd']:.2f} / "
            f"{r['efficiency_in_layer_fwd_bwd']:.2f} | {_alone(r)} | "
            f"{few('ahead_fwd')}/{steps} / {few('ahead_bwd')}/{steps} | "
            f"{slow('host_fwd_ms'):.3f} / {slow('host_bwd_ms'):.3f} |")
    return "\n".join(lines)


def _alone(row: dict) -> str:
    eff = row.get("efficiency_alone_fwd_bwd")
    return "-" if eff is None else f"{eff:.2f}"


def parse_args() -> argparse.Namespace:
    """The run's arguments, each refused by name where it cannot be honoured."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_run_args(p)
    p.add_argument("--forward-dense-area", type=float, default=None,
                   help="the automatic kernel's dense threshold for the ring's forward at "
                        "every call size (visible pairs from which a block runs alone on "
                        "cuDNN; split_ab.set_split); default: the package's")
    p.add_argument("--new-packs", action="store_true",
                   help="a new document pack (so a new mask) every step, as training feeds "
                        "one a micro-batch, for the families with documents; nothing alone")
    p.add_argument("--shape-free-grain", type=int, default=None,
                   help="the grain a shape-free plan carves its cores at (0: none, every "
                        "block varlen, as before the carving); default: the package's")
    p.add_argument("--carve-rings", action=argparse.BooleanOptionalAction, default=None,
                   help="whether a ring's shape-free plan carves its cores too (default: "
                        "the package's, thresholds.CARVE_RINGS)")
    p.add_argument("--cuts-between-slices", action=argparse.BooleanOptionalAction,
                   default=None,
                   help="whether the area layout may move its cuts between slices (default: "
                        "the package's, plan.area.BETWEEN_SLICES; off: even chunks)")
    args = p.parse_args()
    for name in ("warmup", "iters", "tokens"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be at least 1, got {getattr(args, name)}")
    if args.shape_free_grain is not None and args.shape_free_grain < 0:
        p.error(f"--shape-free-grain must be 0 (no carving) or more, got "
                f"{args.shape_free_grain}")
    if args.cpu_smoke and args.forward_dense_area is not None:
        p.error("--forward-dense-area sets the automatic GPU kernel's threshold: not with "
                "--cpu-smoke")
    return args


def set_switches(args: argparse.Namespace) -> None:
    """The package's switches the run names, before any plan key is made or mask placed."""
    if args.shape_free_grain is not None:
        thresholds.SHAPE_FREE_GRAIN = args.shape_free_grain
    if args.carve_rings is not None:
        thresholds.CARVE_RINGS = args.carve_rings
    if args.cuts_between_slices is not None:
        area.BETWEEN_SLICES = args.cuts_between_slices


def main() -> None:
    args = parse_args()
    args.scale = 1.0
    if args.cpu_smoke and "RANK" not in os.environ:
        return spawn_cpu_ranks(args.world)
    if args.cpu_smoke:
        smoke_sizes(args)
    rank, world = start_ranks("gloo") if args.cpu_smoke else start_ranks()
    dev = (torch.device("cpu") if args.cpu_smoke
           else torch.device("cuda", torch.cuda.current_device()))
    dtype = torch.float32 if args.cpu_smoke else torch.bfloat16
    solos = [dist.new_group([r]) for r in range(world)]  # a group of one for 1-GPU plans
    if args.forward_dense_area is not None:
        from split_ab import set_split
        kernel = pick_kernel(None, dtype, args.hq, args.hkv, args.d, dev)
        set_split(kernel, args.forward_dense_area, kernel.lone_band_area,
                  kernel.gpu_bound_min_area, line=math.inf)
    set_switches(args)
    layers = dict(cp=Layer(args.tokens, args.hq, args.hkv, args.d, dev, dtype))
    if rank == 0:  # the one-GPU methods' layer holds the whole sequence's tokens
        layers["one"] = Layer(args.tokens * world, args.hq, args.hkv, args.d, dev, dtype)
    flex = None if args.no_flex or rank else Flex(args.tokens * world, dev)
    health = gpu_health() if rank == 0 else None
    run = run_new_packs if args.new_packs else run_family
    rows = [run(name, args, world, rank, dev, dtype, solos[rank], flex, layers)
            for name in args.families.split(",")]
    rows = [r for r in rows if r is not None]  # families whose mask follows no documents
    hidden = args.hq * args.d
    finish_run(rank, args.out, lambda: family_run_meta(
        args, world, dev, health, heads=f"{args.hq}:{args.hkv}", head_dim=args.d,
        dtype=str(dtype), forward_dense_area=args.forward_dense_area,
        new_pack_every_step=args.new_packs, shape_free_grain=thresholds.SHAPE_FREE_GRAIN,
        carve_rings=thresholds.CARVE_RINGS, cuts_between_slices=area.BETWEEN_SLICES,
        layer=f"hidden {hidden}, FFN {int(FFN_PER_HIDDEN * hidden)} (SwiGLU), QKV, output "
              f"projection, MLP forward and backward"), rows, table)


if __name__ == "__main__":
    main()
