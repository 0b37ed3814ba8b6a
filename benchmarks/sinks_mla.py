"""What attention sinks and MLA head dims cost against the plain kernel, per call, on one GPU.

    python benchmarks/sinks_mla.py --out benchmarks/results/h100_sinks_mla.json

``burst_attn`` at CP=1 (bf16, causal, forward + backward, median of --iters after warm-up,
synchronised), against PyTorch's SDPA on the same shapes:

- gpt-oss-style: 64 query heads, 8 K/V heads, d 64, with and without sinks (a learnable
  logit per head, its gradient included), and with a sliding window of 128 (every other
  gpt-oss layer) with and without sinks;
- DeepSeek-style MLA: 32 heads, Q/K d 192 (128 + 64 RoPE), V d 128, against the same call
  with V at 192 (what a kernel that wants one head dim would run) and against MHA at 128;
  which kernel ran each (cuDNN takes two head dims; PyTorch's flash runs them padded).

Also each case's error against a float64 reference on a short sequence, so a fast wrong
kernel cannot pass. Writes JSON (command, device) and a markdown table beside it.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

import megatron_burst as mb
from megatron_burst.kernels.selection import choose_kernel


def timed(fn, iters: int) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(iters):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def tensors(s: int, hq: int, hkv: int, d: int, dv: int, seed: int = 0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    mk = lambda h, dim: torch.randn(1, s, h, dim, device="cuda", dtype=torch.bfloat16,  # noqa
                                    generator=gen, requires_grad=True)
    q, k, v = mk(hq, d), mk(hkv, d), mk(hkv, dv)
    do = torch.randn(1, s, hq, dv, device="cuda", dtype=torch.bfloat16, generator=gen)
    sinks = torch.randn(hq, device="cuda", generator=gen).requires_grad_()
    return q, k, v, do, sinks


def reference(q, k, v, window, sinks) -> torch.Tensor:
    """Causal attention in float64 from its definition: a sink column per head, if any."""
    q, k, v = (t.double() for t in (q, k, v))
    g = q.shape[2] // k.shape[2]
    k, v = k.repeat_interleave(g, 2), v.repeat_interleave(g, 2)
    s = torch.einsum("bqhd,bkhd->bhqk", q, k) * q.shape[-1] ** -0.5
    n = s.shape[-1]
    i, j = torch.arange(n, device=s.device)[:, None], torch.arange(n, device=s.device)[None]
    hidden = (j > i) | ((i - j > window[0]) if window[0] >= 0 else torch.zeros_like(j > i))
    s = s.masked_fill(hidden, float("-inf"))
    if sinks is not None:
        s = torch.cat([s, sinks.double()[None, :, None, None].expand(*s.shape[:3], 1)], -1)
    return torch.einsum("bhqk,bkhd->bqhd", torch.softmax(s, -1)[..., :n], v)


def error(hq, hkv, d, dv, window, with_sinks) -> float:
    """burst_attn's output against float64 at 1K tokens (the same call, a short sequence)."""
    q, k, v, _, sinks = tensors(1024, hq, hkv, d, dv, seed=5)
    sinks = sinks if with_sinks else None
    out = mb.burst_attn(q, k, v, causal=True, window_size=window, sinks=sinks)
    ref = reference(q, k, v, window, sinks)
    return float((out.double() - ref).norm() / ref.norm())


def case(name, s, hq, hkv, d, dv, iters, window=(-1, -1), with_sinks=False) -> dict:
    q, k, v, do, sinks = tensors(s, hq, hkv, d, dv)
    run = lambda: mb.burst_attn(q, k, v, causal=True, window_size=window,  # noqa: E731
                                sinks=sinks if with_sinks else None).backward(do)
    kernel = choose_kernel(None, q.dtype, hq, hkv, d, q.device, dv=dv).name
    row = dict(case=name, tokens=s, heads=f"{hq}:{hkv}", d=d, dv=dv, window=list(window),
               sinks=with_sinks, ms=timed(run, iters), kernel=kernel,
               rel_err=error(hq, hkv, d, dv, window, with_sinks))
    if dv == d and window == (-1, -1):
        sdpa = lambda: F.scaled_dot_product_attention(  # noqa: E731
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True,
            enable_gqa=hq != hkv).backward(do.transpose(1, 2))
        row["sdpa_ms"] = timed(sdpa, iters)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=16384)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    s, it = args.tokens, args.iters
    rows = [case("gpt-oss-style", s, 64, 8, 64, 64, it),
            case("gpt-oss-style + sinks", s, 64, 8, 64, 64, it, with_sinks=True),
            case("gpt-oss-style window 128", s, 64, 8, 64, 64, it, window=(128, 0)),
            case("gpt-oss-style window 128 + sinks", s, 64, 8, 64, 64, it, window=(128, 0),
                 with_sinks=True),
            case("MHA d 128", s, 32, 32, 128, 128, it),
            case("MLA: Q/K 192, V 128", s, 32, 32, 192, 128, it),
            case("MLA with V at 192", s, 32, 32, 192, 192, it),
            case("MLA: Q/K 192, V 128 + sinks", s, 32, 32, 192, 128, it, with_sinks=True)]
    for r in rows:
        print(r, flush=True)
    meta = dict(command=" ".join(["python", *sys.argv]), device=torch.cuda.get_device_name(0),
                torch=torch.__version__, date=time.strftime("%Y-%m-%d %H:%M:%S"),
                package=os.path.dirname(os.path.abspath(mb.__file__)))
    with open(args.out, "w") as f:
        json.dump(dict(meta=meta, rows=rows), f, indent=1)
    base = {"gpt-oss": rows[0]["ms"], "gpt-oss window": rows[2]["ms"], "MLA": rows[5]["ms"]}
    lines = [f"{meta['device']}, torch {meta['torch']}, {meta['date']}",
             f"command: `{meta['command']}`", "",
             "| case | tokens | heads | d / dv | kernel | fwd+bwd ms | vs without | SDPA ms | "
             "rel err (1K, vs float64) |", "|---|---|---|---|---|---|---|---|---|"]
    ref = [None, base["gpt-oss"], None, base["gpt-oss window"], None, None, base["MLA"],
           base["MLA"]]
    for r, b in zip(rows, ref):
        vs = f"{r['ms'] / b:.3f}" if b else "-"
        lines.append(f"| {r['case']} | {r['tokens']} | {r['heads']} | {r['d']} / {r['dv']} | "
                     f"{r['kernel']} | {r['ms']:.2f} | {vs} | "
                     f"{r['sdpa_ms']:.2f} |" if "sdpa_ms" in r else
                     f"| {r['case']} | {r['tokens']} | {r['heads']} | {r['d']} / {r['dv']} | "
                     f"{r['kernel']} | {r['ms']:.2f} | {vs} | - |")
        lines[-1] += f" {r['rel_err']:.1e} |"
    with open(os.path.splitext(args.out)[0] + ".md", "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
