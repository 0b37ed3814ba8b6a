"""What a new mask every call costs, taken apart: the plan's host time, and the kernel.

    torchrun --nproc_per_node=2 benchmarks/new_mask_cost.py --out OUT

Training brings a new document pack, so a new mask, with every micro-batch.
``slice_masks.py``'s "new pack" column times that against one mask kept for every call,
and on 2x H100 it read up to 2.5x slower (prefix-LM documents 414 against 164 TFLOP/s per
GPU). Two things differ there at once:
- the kernel: a call shape that has seen a second mask plans every later one shape-free
  (``attention.varying_masks``), so its blocks run on the flash kernel (FlashAttention-2),
  which builds nothing per shape, where a fixed mask keeps cuDNN for its large blocks
  (cuDNN builds a graph per new block shape);
- the plan: each new mask is planned, placed and agreed on at its call, on the host,
  before its first kernel.

This runs each new mask three times, each call synchronised and the ranks aligned: first
(planned at the call), then again twice (its plan kept, the same shape-free kernels). The
first against the third is the plan's cost; the third against ``slice_masks.py``'s
same-mask figure (cuDNN) is the kernel's. Families whose masks follow the documents, GQA
64:8, d 128, bf16, 8K tokens per GPU, documents drawn as in ``slice_masks.py``; 6 new masks
warm up, 14 are timed. Writes OUT/new_mask_cost.json and .md.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import zlib

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import megatron_burst as mb  # noqa: E402
from megatron_burst.plan import mask_families as mf  # noqa: E402
from ranks import ran_package, start_ranks  # noqa: E402
from slice_masks import knobs, pile_like  # noqa: E402

FAMILIES = "prefix_lm_document,causal_document,shared_question"


def one_call(mask, full) -> tuple[float, float]:
    """(host ms until the backward returned, wall ms until the GPUs finished) of one fwd+bwd
    on ``mask``'s shards of ``full``, the ranks aligned before it."""
    local = [mb.shard_seq(t, mask=mask).contiguous() for t in full]
    q, k, v = (t.requires_grad_() for t in local[:3])
    torch.cuda.synchronize()
    dist.barrier()
    t0 = time.perf_counter()
    mb.burst_attn(q, k, v, mask=mask).backward(local[3])
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) * 1e3, (time.perf_counter() - t0) * 1e3


def family_rows(name: str, world: int, full, warmup: int, timed: int) -> list[dict]:
    total, base = 8192 * world, zlib.crc32(name.encode())
    masks = [mf.family(name, pile_like(total, seed=base + 1 + i), **knobs(total, 1.0))
             for i in range(warmup + timed)]
    for mask in masks[:warmup]:
        one_call(mask, full)
    rows = []
    for mask in masks[warmup:]:
        new, again, third = (one_call(mask, full) for _ in range(3))
        tflop = 3.5 * 4 * mask.area * 64 * 128 / world / 1e12
        rows.append(dict(area=mask.area, new=new, again=again, third=third,
                         tflops_new=tflop / new[1] * 1e3, tflops_kept=tflop / third[1] * 1e3))
    return rows


def table(meta: dict, results: dict) -> str:
    lines = [f"{meta['device']} x{meta['world']}, torch {meta['torch']}, {meta['date']}, "
             f"8192 tokens/GPU, GQA 64:8, d 128, bf16", f"command: `{meta['command']}`", "",
             "| family | masks | fwd+bwd TFLOP/s/GPU: new mask / its plan kept | wall ms: new / "
             "kept | host ms: new / kept |", "|---|---|---|---|---|"]
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    for name, rows in results.items():
        lines.append(
            f"| {name} | {len(rows)} | {mean([r['tflops_new'] for r in rows]):.0f} / "
            f"{mean([r['tflops_kept'] for r in rows]):.0f} | "
            f"{mean([r['new'][1] for r in rows]):.2f} / {mean([r['third'][1] for r in rows]):.2f}"
            f" | {mean([r['new'][0] for r in rows]):.2f} / "
            f"{mean([r['third'][0] for r in rows]):.2f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--families", default=FAMILIES)
    p.add_argument("--warmup", type=int, default=6)
    p.add_argument("--timed", type=int, default=14)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    rank, world = start_ranks()
    dev = torch.device("cuda", torch.cuda.current_device())
    gen = torch.Generator(device=dev).manual_seed(1)
    full = [torch.randn(1, 8192 * world, h, 128, device=dev, dtype=torch.bfloat16,
                        generator=gen) for h in (64, 8, 8, 64)]
    results = {name: family_rows(name, world, full, args.warmup, args.timed)
               for name in args.families.split(",")}
    if rank == 0:
        meta = dict(device=torch.cuda.get_device_name(dev), world=world,
                    torch=torch.__version__, date=time.strftime("%Y-%m-%d"),
                    package=ran_package(), command=" ".join(["benchmarks/new_mask_cost.py",
                                                             *sys.argv[1:]]))
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "new_mask_cost.json"), "w") as f:
            json.dump(dict(meta=meta, families=results), f, indent=1)
        text = table(meta, results)
        with open(os.path.join(args.out, "new_mask_cost.md"), "w") as f:
            f.write(text)
        print(text)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
