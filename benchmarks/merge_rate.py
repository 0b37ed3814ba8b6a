"""How close the fused online-softmax merge runs to the GPU's memory bandwidth.

    python benchmarks/merge_rate.py --out DIR      (one GPU; PYTHONPATH picks the package)

Why: on 2x H100 the slice-mask forwards spent 0.7-1.1 ms a call in ``_merge_kernel``
(``slice_mask_profile.py``: causal blockwise six merges of 118 us, the global window four
of 284 us), about 65 us per 1,000 rows of 64 heads x 128, whatever the accumulator's dtype:
a third of what the bytes allow. For rows 1K / 8K, heads 64, d 128, bf16 partials into
bf16 and fp32 accumulators, this times ``merge.merge_partial`` against torch's ``add_`` of
the same tensors (the same bytes but the lse: the bandwidth a plain elementwise kernel
gets), each over 8 sets of tensors in turn so that no set stays in L2, and counts the vector
and scalar global loads in the merge's PTX. Prints a table, writes merge_rate.json.
``--sweep``: also the kernel at other positions a program and warps (``merge._launch``),
for the 1K-row merges a window's second step makes (48 us against add_'s 20 on one H100).
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch

from megatron_burst.kernels import merge

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ranks import ran_package  # noqa: E402

HEADS, DIM, SETS, ITERS = 64, 128, 8, 40


def tensors(rows: int, acc: torch.dtype, seed: int):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    out = torch.randn(1, rows, HEADS, DIM, device="cuda", generator=gen).to(acc)
    blk = torch.randn(1, rows, HEADS, DIM, device="cuda", generator=gen).to(torch.bfloat16)
    lse, blse = (torch.randn(1, HEADS, rows, device="cuda", generator=gen) for _ in range(2))
    return out, lse, blk, blse


def timed_us(fn, sets) -> float:
    for s in sets:  # warm-up: compiles, first touches
        fn(*s)
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for i in range(ITERS):
        fn(*sets[i % len(sets)])
    stop.record()
    torch.cuda.synchronize()
    return start.elapsed_time(stop) * 1e3 / ITERS


def ptx_loads() -> dict:
    """Global loads in the merge's compiled PTX (every variant compiled so far)."""
    counts = {"vector": 0, "scalar": 0}
    for cache in getattr(merge._merge_kernel, "device_caches", {}).values():
        for kernel in cache[0].values():
            ptx = kernel.asm.get("ptx", "")
            for line in ptx.splitlines():
                if "ld.global" in line:
                    counts["vector" if ".v2" in line or ".v4" in line else "scalar"] += 1
    return counts


def row(rows: int, acc: torch.dtype) -> dict:
    sets = [tensors(rows, acc, seed) for seed in range(SETS)]
    values = rows * HEADS * DIM
    moved = values * (2 * torch.finfo(acc).bits // 8 + 2)  # out read+written, partial read
    merge_us = timed_us(merge.merge_partial, sets)
    add_us = timed_us(lambda o, _l, b, _bl: o.add_(b), sets)
    moved_merge = moved + rows * HEADS * 4 * 3  # lse read+written, block lse read
    return {"rows": rows, "acc": str(acc).replace("torch.", ""), "merge_us": merge_us,
            "merge_GBps": moved_merge / merge_us / 1e3, "add_us": add_us,
            "add_GBps": moved / add_us / 1e3, "merge_over_add": merge_us / add_us}


def sweep() -> list[dict]:
    """The fused merge's time at each (positions a program, warps), bf16 and fp32 homes."""
    out = []
    for n, acc in ((1024, torch.bfloat16), (1024, torch.float32), (8192, torch.float32)):
        sets = [tensors(n, acc, seed) for seed in range(SETS)]
        for rows in (8, 16, 32, 64):
            for warps in (1, 2, 4, 8):
                us = timed_us(lambda o, l, b, bl: merge._launch(o, l, b, bl, rows, warps), sets)
                out.append({"rows": n, "acc": str(acc).replace("torch.", ""),
                            "per_program": rows, "num_warps": warps, "merge_us": us})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--sweep", action="store_true",
                        help="also the merge at other positions a program and warps")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    rows = [row(n, acc) for n in (1024, 8192) for acc in (torch.bfloat16, torch.float32)]
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
            "package": ran_package(), "command": "python " + " ".join(sys.argv),
            "heads": HEADS, "dim": DIM, "sets": SETS, "iters": ITERS, "ptx_loads": ptx_loads()}
    lines = [f"{meta['device']}, {meta['package']}, PTX global loads {meta['ptx_loads']}",
             "| rows | accumulator | merge us | merge GB/s | add_ us | add_ GB/s | merge / add_ |",
             "|---|---|---|---|---|---|---|"]
    lines += [f"| {r['rows']} | {r['acc']} | {r['merge_us']:.1f} | {r['merge_GBps']:.0f} | "
              f"{r['add_us']:.1f} | {r['add_GBps']:.0f} | {r['merge_over_add']:.2f} |"
              for r in rows]
    swept = sweep() if args.sweep else []
    for n, acc in sorted({(r["rows"], r["acc"]) for r in swept}):
        best = min((r for r in swept if (r["rows"], r["acc"]) == (n, acc)),
                   key=lambda r: r["merge_us"])
        lines.append(f"sweep {n} rows into {acc}: fastest {best['merge_us']:.1f} us at "
                     f"{best['per_program']} positions a program, {best['num_warps']} warps")
    print("\n".join(lines))
    with open(os.path.join(args.out, "merge_rate.json"), "w") as f:
        json.dump({"meta": meta, "rows": rows, "sweep": swept}, f, indent=1)
    with open(os.path.join(args.out, "merge_rate.md"), "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
