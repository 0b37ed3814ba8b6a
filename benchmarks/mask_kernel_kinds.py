"""Where a mask family's GPU time goes on a ring against one GPU, by kind of kernel (issue 42).

    torchrun --nproc_per_node=2 benchmarks/mask_kernel_kinds.py \
        --families block_causal_document,causal_document --out $OUT/kernel_kinds

A new document pack every call, as training feeds them (``slice_masks.new_packs``; its
plans shape-free, carved as the package carves them), ``burst_attn`` forward and backward
(GQA 64:8, d 128, bf16, ``--tokens`` a GPU) on the ring of all ranks, then on rank 0 alone
over the whole sequence, the same packs: ``--warmup`` packs, then ``--iters`` under
``torch.profiler``. Per rank, the kernels' GPU time per call grouped by kind (cuDNN's
attention, the varlen flash kernel, NCCL, merges, elementwise ops and copies, the rest) and the
largest kernels by name. The "fastest single-GPU kernel" of ``in_layer.py`` is a plan of
the same kernels, so the kinds say which kernels a ring spends its extra time in. NCCL's
time is a kernel waiting for its peer (it holds a few SMs), not transfer time.
Writes OUT.json and OUT.md.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import sys

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import megatron_burst as mb  # noqa: E402
from ranks import start_ranks  # noqa: E402
from slice_masks import new_packs  # noqa: E402

KINDS = (("nccl", ("nccl",)), ("cudnn", ("cudnn",)), ("flash", ("flash",)),
         ("merge", ("merge",)), ("elementwise/copy", ("copy", "memcpy", "elementwise", "fill")))


def kind(name: str) -> str:
    low = name.lower()
    return next((k for k, marks in KINDS if any(m in low for m in marks)), "other")


def profiled(group, total: int, masks: list, args) -> dict:
    """Kernel ms per call by kind and the largest kernels, over the profiled packs."""
    dev = torch.device("cuda", torch.cuda.current_device())
    gen = torch.Generator(device=dev).manual_seed(3)
    full = [torch.randn(1, total, h, args.d, device=dev, dtype=torch.bfloat16, generator=gen)
            for h in (args.hq, args.hkv, args.hkv, args.hq)]

    def call(mask):
        local = [mb.shard_seq(t, group, mask=mask).contiguous() for t in full]
        q, k, v = (t.requires_grad_() for t in local[:3])
        mb.burst_attn(q, k, v, group, mask=mask).backward(local[3])

    for mask in masks[:args.warmup]:
        call(mask)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for mask in masks[args.warmup:]:
            call(mask)
        torch.cuda.synchronize()
    by_kind, by_name, calls = collections.Counter(), collections.Counter(), collections.Counter()
    for e in prof.key_averages():
        if e.device_type.name == "CUDA":
            ms = e.self_device_time_total / 1e3 / args.iters
            by_kind[kind(e.key)] += ms
            by_name[e.key[:100]] += ms
            calls[e.key[:100]] += e.count / args.iters
    return dict(ms_by_kind=dict(by_kind.most_common()),
                largest=[dict(kernel=k, ms=ms, calls=calls[k])
                         for k, ms in by_name.most_common(12)])


def table(rows: list[dict]) -> str:
    kinds = [k for k, _ in KINDS] + ["other"]
    lines = ["| family | where | rank | " + " | ".join(f"{k} ms" for k in kinds)
             + " | all but NCCL ms |", "|---|---|---|" + "---|" * (len(kinds) + 1)]
    for r in rows:
        got = r["ms_by_kind"]
        busy = sum(v for k, v in got.items() if k != "nccl")
        lines.append(f"| {r['family']} | {r['where']} | {r['rank']} | "
                     + " | ".join(f"{got.get(k, 0.0):.3f}" for k in kinds) + f" | {busy:.3f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--families", default="block_causal_document,causal_document")
    p.add_argument("--tokens", type=int, default=8192, help="tokens a GPU")
    p.add_argument("--heads", default="64:8:128", help="hq:hkv:head_dim")
    p.add_argument("--warmup", type=int, default=30)
    p.add_argument("--iters", type=int, default=8)
    p.add_argument("--out", required=True, help="path prefix: writes OUT.json and OUT.md")
    args = p.parse_args()
    heads = args.heads.split(":")
    if len(heads) != 3 or not all(x.isdigit() and int(x) > 0 for x in heads) or \
            int(heads[0]) % int(heads[1]):
        p.error(f"--heads must be hq:hkv:head_dim, positive, hq a multiple of hkv; got "
                f"{args.heads!r}")
    args.hq, args.hkv, args.d = (int(x) for x in heads)
    for name in ("warmup", "iters", "tokens"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be at least 1, got {getattr(args, name)}")
    rank, world = start_ranks()
    solo = [dist.new_group([r]) for r in range(world)][rank]
    rows = []
    for name in args.families.split(","):
        total = args.tokens * world
        masks = new_packs(name, total, 1.0, args.warmup + args.iters)
        if masks is None:
            p.error(f"--families: {name}'s mask does not follow the documents")
        mine = [dict(family=name, where=f"ring of {world}", rank=rank,
                     **profiled(dist.group.WORLD, total, masks, args))]
        dist.barrier()
        if rank == 0:
            mine.append(dict(family=name, where="one GPU", rank=0,
                             **profiled(solo, total, masks, args)))
        dist.barrier()
        gathered = [None] * world
        dist.all_gather_object(gathered, mine)
        rows += [r for part in gathered for r in part]
    if rank == 0:
        with open(args.out + ".json", "w") as f:
            json.dump(dict(device=torch.cuda.get_device_name(), torch=torch.__version__,
                           world=world, command=" ".join(sys.argv), rows=rows), f, indent=1)
        with open(args.out + ".md", "w") as f:
            f.write(table(rows))
        print(table(rows))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
