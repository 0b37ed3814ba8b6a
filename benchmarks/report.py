"""Turn benchmark JSON files into the table, the plots and the README summary.

    python benchmarks/report.py benchmarks/results/*.json

Prints one table per file (and writes ``<name>.md`` beside it), and draws
``throughput.png`` (TFLOP/s per GPU against tokens per GPU) and ``efficiency.png``
(efficiency against GPUs) in the results folder. Efficiency = a method's per-GPU TFLOP/s
over the single-GPU kernel's TFLOP/s on the full sequence, from the same run and case.
"""
from __future__ import annotations

import json
import os
import sys
from collections import defaultdict


def load(paths):
    runs = []
    for p in paths:
        with open(p) as f:
            runs.append((p, json.load(f)))
    return runs


def with_efficiency(rows):
    single = {}
    for r in rows:
        if r.get("method") == "single-gpu kernel":
            single[(r["world"], r["per_gpu"], r["heads"], r["mask"])] = r["tflops_per_gpu"]
    for r in rows:
        base = single.get((r.get("world"), r.get("per_gpu"), r.get("heads"), r.get("mask")))
        if base and "tflops_per_gpu" in r and r["method"] != "single-gpu kernel":
            r["efficiency"] = r["tflops_per_gpu"] / base
    return rows


def table(meta, rows) -> str:
    head = ("| GPUs | tok/GPU | heads | mask | method | fwd ms | bwd ms | fwd+bwd ms | "
            "TFLOP/s/GPU | efficiency | fwd MiB | bwd MiB | peak GiB | rel err | "
            "time model ms |")
    lines = [f"{meta['device']} x{meta['gpus']}, torch {meta['torch']}, {meta['date']}",
             f"command: `{meta['command']}`"]
    if meta.get("profile"):
        lines.append(f"time model profile: {meta['profile']}; environment: {meta.get('env')}")
    lines += ["", head, "|" + "---|" * 15]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r.get('world', '')} | {r.get('per_gpu', '')} | {r.get('heads', '')}"
                         f" | {r.get('mask', '')} | {r['method']} | error: {r['error'][:80]} |"
                         + " |" * 9)
            continue
        tok = r["per_gpu"] if r["method"] != "single-gpu kernel" else f"{r['tokens']} (1 GPU)"
        f = lambda k, fmt="{:.1f}": fmt.format(r[k]) if k in r and r[k] == r[k] else "-"  # noqa
        lines.append(f"| {r['world']} | {tok} | {r['heads']} | {r['mask']} | {r['method']} | "
                     f"{f('fwd_ms')} | {f('bwd_ms')} | {f('total_ms')} | "
                     f"{f('tflops_per_gpu', '{:.0f}')} | {f('efficiency', '{:.2f}')} | "
                     f"{f('fwd_MiB', '{:.0f}')} | {f('bwd_MiB', '{:.0f}')} | "
                     f"{f('peak_GiB', '{:.1f}')} | {f('rel_err_vs_single', '{:.1e}')} | "
                     f"{f('predicted_ms')} |")
    return "\n".join(lines)


def plots(all_rows, outdir):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # One point per (method, heads, world, length); later files win (list is in file order).
    points: dict = {}
    for r in all_rows:
        if ("tflops_per_gpu" in r and r["mask"] == "causal" and r["method"] in
                ("burst (auto bwd)", "ulysses a2a (written here)",
                 "all-gather KV (written here)", "pytorch native CP (ring)")):
            points[(r["method"], r["heads"], r["world"], r["per_gpu"])] = r["tflops_per_gpu"]
    series = defaultdict(list)
    for (method, heads, world, per_gpu), tflops in points.items():
        series[(method, heads, world)].append((per_gpu, tflops))
    fig, ax = plt.subplots(figsize=(8, 5))
    for (method, heads, world), pts in sorted(series.items()):
        if world != 4:
            continue
        pts.sort()
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o",
                label=f"{method} {heads}")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("tokens per GPU")
    ax.set_ylabel("fwd+bwd TFLOP/s per GPU (4 H200, causal, unmasked FLOPs)")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(os.path.join(outdir, "throughput.png"), dpi=120)

    # Later files win where two runs measured the same point (the list is in file order).
    eff: dict = {}
    for r in all_rows:
        if "efficiency" in r and r["mask"] == "causal" and r["heads"] == "32:32":
            eff[(r["method"], r["per_gpu"], r["world"])] = r["efficiency"]
    methods = ["burst (auto bwd)", "ulysses a2a (written here)",
               "all-gather KV (written here)", "pytorch native CP (ring)"]
    fig, ax = plt.subplots(figsize=(8, 5))
    for color, method in zip(["C3", "C0", "C2", "C7"], methods):
        for per_gpu, style in ((32768, "-"), (8192, "--")):
            pts = sorted((w, e) for (m, p, w), e in eff.items() if m == method and p == per_gpu)
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], style, marker="o", color=color,
                        label=f"{method}, {per_gpu // 1024}K/GPU")
    ax.set_xlabel("GPUs (H200, NVLink)")
    ax.set_ylabel("efficiency vs single-GPU kernel (causal, MHA 32 heads)")
    ax.set_xticks([1, 2, 4, 8])
    ax.axhline(1.0, color="k", lw=0.5)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(os.path.join(outdir, "efficiency.png"), dpi=120)


def megatron_table(run) -> str:
    """A megatron_e2e.py result: one line per training run."""
    lines = [f"{run['device']}, {run['date']}", f"command: `{run['command']}`", "",
             "| run | GPUs | tokens | tokens/s | TFLOP/s/GPU (Megatron) | ms/iter (steady) | "
             "max allocated GiB | plan error |",
             "|---|---|---|---|---|---|---|---|"]
    checks = {c["run"]: c for c in run.get("memory_checks", [])}
    for r in run["runs"]:
        steady = r["ms_per_iter"][2:]
        ms = sum(steady) / len(steady) if steady else float("nan")
        err = checks.get(r["name"], {}).get("error")
        lines.append(
            f"| {r['name']} | {r['gpus']} | {r.get('seq_length', '-')} | "
            f"{r['tokens_per_s'] or float('nan'):.0f} | {r.get('tflops_per_gpu') or float('nan'):.0f} | "
            f"{ms:.0f} | {(r['max_allocated_MiB'] or float('nan')) / 1024:.1f} | "
            f"{'-' if err is None else f'{err:+.1%}'} |")
    return "\n".join(lines)


def megatron_plot(run, out: str) -> None:
    """Tokens/s and peak memory per run of a megatron_e2e.py result, side by side."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [r for r in run["runs"] if r.get("tokens_per_s")]
    if not runs:
        return
    names = [r["name"] for r in runs]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    colors = ["C3" if "burst" in n else "C0" for n in names]
    left.bar(names, [r["tokens_per_s"] / 1e3 for r in runs], color=colors)
    left.set_ylabel("tokens/s (thousands)")
    right.bar(names, [r["max_allocated_MiB"] / 1024 for r in runs], color=colors)
    right.set_ylabel("max allocated per GPU (GiB)")
    for ax in (left, right):
        ax.tick_params(axis="x", rotation=30, labelsize=8)
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle(f"pretrain_gpt end to end, {run['device']}", fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=120)


def main(paths):
    all_rows = []
    for path, run in load(paths):
        if "runs" in run:  # an end-to-end Megatron result (benchmarks/megatron_e2e.py)
            text = megatron_table(run)
            print(text, "\n")
            with open(os.path.splitext(path)[0] + ".md", "w") as f:
                f.write(text + "\n")
            megatron_plot(run, os.path.splitext(path)[0] + ".png")
            continue
        rows = with_efficiency(run["rows"])
        text = table(run["meta"], rows)
        print(text, "\n")
        with open(os.path.splitext(path)[0] + ".md", "w") as f:
            f.write(text + "\n")
        all_rows += rows
    if all_rows:  # attention results only: an e2e file alone leaves these plots alone
        plots(all_rows, os.path.dirname(paths[0]) or ".")
        documents_plot(all_rows, os.path.dirname(paths[0]) or ".")


DOC_METHODS = ("burst whole_docs (auto bwd)", "burst per-document zigzag (TE-style)",
               "all-gather KV + varlen (torchtitan-style)", "ulysses + varlen")


def documents_plot(all_rows, outdir):
    """Packed documents: each method's efficiency against the single-GPU varlen kernel."""
    rows = [r for r in all_rows if r.get("mask", "").startswith("docs") and "efficiency" in r
            and r["method"] in DOC_METHODS]
    if not rows:
        return
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cases = sorted({(r["mask"], r["per_gpu"], r["heads"]) for r in rows})
    eff = {(r["mask"], r["per_gpu"], r["heads"], r["method"]): r["efficiency"] for r in rows}
    fig, ax = plt.subplots(figsize=(10, 5))
    width = 0.8 / len(DOC_METHODS)
    for i, method in enumerate(DOC_METHODS):
        ax.bar([c + i * width for c in range(len(cases))],
               [eff.get((*case, method), 0) for case in cases], width, label=method)
    ax.set_xticks([c + 0.4 - width / 2 for c in range(len(cases))])
    ax.set_xticklabels([f"{m}\n{p // 1024}K/GPU {h}" for m, p, h in cases], fontsize=7)
    ax.set_ylabel("efficiency vs the single-GPU varlen kernel")
    ax.axhline(1.0, color="grey", lw=0.5)
    ax.legend(fontsize=7)
    fig.suptitle("packed causal documents, 4 H200, bf16, d=128, fwd+bwd", fontsize=10)
    fig.tight_layout()
    fig.savefig(os.path.join(outdir, "documents.png"), dpi=120)


if __name__ == "__main__":
    main(sys.argv[1:])
