"""Why layout ``pack_zigzag`` loses on the diagonal, and what a tiled diagonal would win
(one GPU, torch's varlen flash kernel alone; issue 39).

A diagonal block of ``pack_zigzag`` (a chunk of C rows against itself, causal within each
document) is one varlen call whose sequences are *every* document of the pack cut to the
chunk (N + 2 of them, N the padded document count), with max_seqlen C. The flash kernel
launches ceil(max_seqlen / 128) row blocks per sequence, empty or not, so the grid is
(N + 2) * C / 128 per head where the work is about C / 128. This script times, on the same
chunk and documents:

- ``docs``: the chunk's own documents only (the grid a host-planned call gets);
- ``padded``: today's pack_zigzag diagonal (N + 2 sequences, max_seqlen C);
- ``tiles M``: the diagonal cut into tiles of M rows: one causal call over the documents cut
  at tile edges (N + 2 + C / M sequences, max_seqlen M), plus one full call per level of a
  binary split of the chunk (level S = M * 2^l: each aligned pair of S-row halves adds the
  document that straddles their midpoint, its right-half queries against its left-half keys:
  five sequences a pair, max_seqlen S), each merged into the output. Every pair of one
  document is in exactly one call (``--check`` proves it on dense masks).

Usage: python benchmarks/diagonal_grid.py [--check] [--out FILE.json]
       python benchmarks/diagonal_grid.py --table FILE.json   (a run's markdown table)
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys

import numpy as np
import torch

# The repository after $PYTHONPATH's entries, so a run on another tree times that tree.
sys.path.append(os.path.join(os.path.dirname(__file__), ".."))
from benchmarks.documents import pack_lengths  # noqa: E402
from benchmarks.ranks import ran_package  # noqa: E402


def tiles_calls(cu: np.ndarray, g: int, c: int, m: int) -> list[tuple]:
    """(cu_q, cu_k, max_q, max_k, causal) of the tiled diagonal of chunk [g, g + c)."""
    rel = np.clip(cu - g, 0, c)
    short = np.sort(np.concatenate((rel, np.arange(0, c + 1, m))))
    calls = [(short, short, m, m, True)]
    s = m
    while s < c:
        q, k = [0], [0]
        for a in range(0, c, 2 * s):
            mid, b = a + s, min(a + 2 * s, c)
            i = np.searchsorted(cu, g + mid, side="right")
            start, end = cu[i - 1], cu[i]
            k0, q1 = int(np.clip(start - g, a, mid)), int(np.clip(end - g, mid, b))
            q += [mid, mid, q1, b, b]
            k += [a, k0, mid, mid, b]
        calls.append((np.array(q), np.array(k), s, s, False))
        s *= 2
    return calls


def visible(call, c: int) -> np.ndarray:
    cu_q, cu_k, _, _, causal = call
    out = np.zeros((c, c), dtype=np.int64)
    for i in range(len(cu_q) - 1):
        q0, q1, k0, k1 = cu_q[i], cu_q[i + 1], cu_k[i], cu_k[i + 1]
        if q1 > q0 and k1 > k0:
            blk = np.ones((q1 - q0, k1 - k0), dtype=np.int64)
            if causal:
                blk = np.tril(blk, (k1 - k0) - (q1 - q0))
            out[q0:q1, k0:k1] += blk
    return out


def check() -> None:
    """Every visible pair of the chunk in exactly one call, no other pair, on random packs."""
    rng = np.random.default_rng(0)
    for trial in range(200):
        c, m = 256, int(rng.choice([8, 16, 32, 64]))
        lens = rng.integers(1, int(rng.choice([4, 40, 300])), size=200)
        cu = np.concatenate(([0], np.cumsum(lens)))
        cu = cu[cu < 4 * c].tolist() + [4 * c]
        cu = np.array(cu)
        g = int(rng.integers(0, 3)) * c
        doc = np.searchsorted(cu, np.arange(g, g + c), side="right")
        want = (doc[:, None] == doc[None, :]) & np.tril(np.ones((c, c), bool))
        got = sum(visible(call, c) for call in tiles_calls(cu, g, c, m))
        assert (got == want).all(), (trial, m)
    print("check: 200 random chunks, every pair once")


def run(q, k, v, calls) -> None:
    outs = []
    for cu_q, cu_k, max_q, max_k, causal in calls:
        out, lse, *_ = torch.ops.aten._flash_attention_forward(
            q, k, v, cu_q, cu_k, max_q, max_k, 0.0, causal, False)
        outs.append((out, lse))
    if len(outs) > 1:  # the merges: one pass over out and lse per extra call
        acc, acc_lse = outs[0][0].float(), outs[0][1]
        for out, lse in outs[1:]:
            new = torch.logaddexp(acc_lse, lse)
            acc = (acc * (acc_lse - new).exp().T[..., None]
                   + out * (lse - new).exp().T[..., None])
            acc_lse = new
        outs[0] = (acc.to(q.dtype), acc_lse)
    dout = torch.ones_like(q)
    for (cu_q, cu_k, max_q, max_k, causal), (out, lse) in zip(calls, outs[:1] * len(calls)):
        torch.ops.aten._flash_attention_backward(
            dout, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, 0.0, causal,
            torch.empty(2, dtype=torch.int64, device=q.device), torch.empty(0, device=q.device))


def ms(fn, iters=20) -> float:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(iters):
        fn()
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b) / iters


def case(chunk: int, hq: int, hkv: int, d: int, mix: str) -> list[dict]:
    dev = torch.device("cuda")
    lens = pack_lengths(4 * chunk, mix, seed=1)
    cu = np.concatenate(([0], np.cumsum(lens)))
    g = chunk  # the pack's second chunk
    n = -(-(len(lens) + 1) // 8) * 8
    framed = np.concatenate(([0], cu, np.full(n + 1 - len(cu), cu[-1]), [4 * chunk]))
    rel = np.clip(framed - g, 0, chunk)
    own = np.unique(rel)
    gpu = lambda a: torch.tensor(np.asarray(a), dtype=torch.int32, device=dev)  # noqa: E731
    variants = {"docs": [(own, own, int(np.diff(own).max()), int(np.diff(own).max()), True)],
                "padded": [(rel, rel, chunk, chunk, True)]}
    for m in (128, 256, 512, 1024):
        if m < chunk:
            variants[f"tiles {m}"] = tiles_calls(cu, g, chunk, m)
    q = torch.randn(chunk, hq, d, device=dev, dtype=torch.bfloat16)
    k = torch.randn(chunk, hkv, d, device=dev, dtype=torch.bfloat16)
    v = torch.randn_like(k)
    rows = []
    for name, calls in variants.items():
        calls = [(gpu(a), gpu(b), int(x), int(y), c) for a, b, x, y, c in calls]
        grid = sum((len(c[0]) - 1) * math.ceil(c[2] / 128) for c in calls)
        t = ms(lambda: run(q, k, v, calls))
        rows.append(dict(chunk=chunk, heads=f"{hq}:{hkv}x{d}", mix=mix, docs=len(lens),
                         padded_to=n, variant=name, calls=len(calls), grid_per_head=grid,
                         ms=round(t, 3)))
        print(rows[-1], flush=True)
    return rows


def table(path: str) -> str:
    """A run's rows as one line per case: fwd+bwd ms of each variant (grid per head)."""
    with open(path) as f:
        run = json.load(f)
    cases: dict = {}
    for r in run["rows"]:
        key = (r["chunk"], r["heads"], r["mix"], r["docs"], r["padded_to"])
        cases.setdefault(key, {})[r["variant"]] = f"{r['ms']:.2f} ({r['grid_per_head']})"
    names = list(dict.fromkeys(r["variant"] for r in run["rows"]))
    lines = [f"{run['meta']['device']}, torch {run['meta']['torch']}", "",
             "| chunk | heads | mix | docs (padded) | " + " | ".join(names) + " |",
             "|---" * (4 + len(names)) + "|"]
    for (chunk, heads, mix, docs, padded), got in cases.items():
        lines.append(f"| {chunk} | {heads} | {mix} | {docs} ({padded}) | "
                     + " | ".join(got.get(n, "-") for n in names) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="prove the tiling on CPU, exit")
    parser.add_argument("--table", default=None, help="print a run's table, exit")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    if args.table:
        print(table(args.table))
        return
    check()
    if args.check:
        return
    rows = []
    for chunk in (4096, 8192):
        for hq, hkv, d in ((32, 8, 128), (16, 4, 64)):
            for mix in ("lognormal", "uniform", "tiny"):
                rows += case(chunk, hq, hkv, d, mix)
    meta = dict(device=torch.cuda.get_device_name(), torch=torch.__version__,
                package=ran_package(),
                command="python benchmarks/diagonal_grid.py " + " ".join(sys.argv[1:]))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(dict(meta=meta, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
