"""Where a CP=1 call's host time goes: launches and host milliseconds per call, on one GPU.

    python benchmarks/host_profile.py --out benchmarks/results/h100_host_profile.json

Tiny tensors (256 tokens, d 64, bf16, causal), so the GPU's work is negligible and a call
is its host work: ``burst_attn`` forward + backward against PyTorch's SDPA on the same
shapes (MHA 16:16 and GQA 16:4; SDPA with ``enable_gqa``), each kernel forced and chosen.
For each: the median host milliseconds of a forward + backward (to the return of
``backward``; the cases timed in turn, round after round) and its excess over SDPA's, and the CUDA kernels and CPU ops one call runs (``torch.profiler``). Also a
probe of whether PyTorch's cuDNN op takes K/V with fewer heads than Q (no expansion).
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

import megatron_burst as mb


def host_ms(fns: dict, iters: int) -> dict:
    """Median host ms of each of ``fns``, timed in turn round after round, so a drift of the
    host's clock or load over the run falls on every case alike."""
    for fn in fns.values():
        for _ in range(10):
            fn()
    times = {name: [] for name in fns}
    for _ in range(iters):
        for name, fn in fns.items():
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            fn()
            times[name].append((time.perf_counter() - t0) * 1e3)
    torch.cuda.synchronize()
    return {name: statistics.median(t) for name, t in times.items()}


def launches(fn) -> tuple[int, list[str]]:
    """CUDA kernels and the top CPU ops of one call."""
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type.name == "CUDA"]
    ops = collections.Counter(e.name for e in prof.events()
                              if e.device_type.name == "CPU" and e.name.startswith("aten::"))
    return len(kernels), [f"{n} x{c}" for n, c in ops.most_common(14)]


def cases(hq: int, hkv: int):
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(1, 256, h, 64, device="cuda", dtype=torch.bfloat16, generator=gen,
                           requires_grad=True) for h in (hq, hkv, hkv))
    do = torch.randn_like(q)

    def burst(kernel=None):
        return lambda: mb.burst_attn(q, k, v, causal=True, kernel=kernel).backward(do)

    def sdpa():
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                             v.transpose(1, 2), is_causal=True,
                                             enable_gqa=hq != hkv)
        out.backward(do.transpose(1, 2))
    yield "SDPA (PyTorch's choice)", sdpa
    yield "burst_attn (chosen kernel)", burst()
    yield "burst_attn kernel=cudnn", burst("cudnn")
    yield "burst_attn kernel=torch-flash", burst("torch-flash")


def cudnn_takes_gqa() -> str:
    """Whether aten's cuDNN op runs K/V with fewer heads than Q, and matches expanding them."""
    gen = torch.Generator(device="cuda").manual_seed(1)
    q = torch.randn(1, 16, 256, 64, device="cuda", dtype=torch.bfloat16, generator=gen)
    k, v = (torch.randn(1, 4, 256, 64, device="cuda", dtype=torch.bfloat16, generator=gen)
            for _ in range(2))
    try:
        out = torch.ops.aten._scaled_dot_product_cudnn_attention(q, k, v, None, True, 0.0,
                                                                  True, False, scale=0.125)[0]
    except Exception as e:  # noqa: BLE001  (the answer is the error)
        return f"no: {type(e).__name__}: {str(e)[:160]}"
    ref = torch.ops.aten._scaled_dot_product_cudnn_attention(
        q, k.repeat_interleave(4, 1), v.repeat_interleave(4, 1), None, True, 0.0, True, False,
        scale=0.125)[0]
    err = ((out.float() - ref.float()).norm() / ref.float().norm()).item()
    return f"runs; relative difference from expanded K/V {err:.1e}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=200)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    rows = []
    for hq, hkv in ((16, 16), (16, 4)):
        runs, found = {}, []
        for name, fn in cases(hq, hkv):
            try:
                n, ops = launches(fn)
                runs[name] = fn
                found.append(dict(heads=f"{hq}:{hkv}", case=name, kernels=n, ops=ops))
            except ValueError as e:  # a forced kernel that refuses the call
                found.append(dict(heads=f"{hq}:{hkv}", case=name, error=str(e)[:200]))
        medians = host_ms(runs, args.iters)
        sdpa = medians.get("SDPA (PyTorch's choice)")
        for row in found:
            if row["case"] in medians:
                row["host_ms"] = medians[row["case"]]
                row["over_sdpa_ms"] = None if sdpa is None else row["host_ms"] - sdpa
            print(row, flush=True)
        rows += found
    meta = dict(command=" ".join(["python", *sys.argv]), device=torch.cuda.get_device_name(0),
                torch=torch.__version__, date=time.strftime("%Y-%m-%d %H:%M:%S"),
                package=os.path.dirname(os.path.abspath(mb.__file__)),
                cudnn_gqa=cudnn_takes_gqa())
    with open(args.out, "w") as f:
        json.dump(dict(meta=meta, rows=rows), f, indent=1)
    lines = [f"{meta['device']}, torch {meta['torch']}, {meta['date']}",
             f"command: `{meta['command']}`", f"cuDNN op with fewer K/V heads: {meta['cudnn_gqa']}",
             "", "| heads | case | host ms fwd+bwd | over SDPA ms | CUDA kernels |",
             "|---|---|---|---|---|"]
    lines += [f"| {r['heads']} | {r['case']} | {r.get('host_ms', float('nan')):.3f} | "
              f"{r.get('over_sdpa_ms') or 0:+.3f} | {r.get('kernels', r.get('error', '-'))} |"
              for r in rows]
    with open(os.path.splitext(args.out)[0] + ".md", "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
