"""End to end with Megatron's CUDA graphs (--cuda-graph-impl local) against eager.

    python benchmarks/megatron_graphs.py --shape small --out benchmarks/results/megatron_graphs_small_h200x2.json
    python benchmarks/megatron_graphs.py --shape small --documents 32 --out ...documents.json

The package's entry point, mock data, CP=2 on 2 GPUs (and CP=1 on one for `small`), with
and without `--cuda-graph-impl local`: iteration time, losses (graphs must not change them
beyond bf16 noise), and model FLOPs / MFU from the run's own printed count of what it does
(as benchmarks/megatron_documents.py reads it). ``--documents CAPACITY``: with document
masks, the default layout (whole_docs, eager: its packs cannot be captured) against
pack_zigzag eager and captured (boundaries padded to CAPACITY documents: one shape).
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import megatron_documents  # noqa: E402
import megatron_e2e  # noqa: E402

from megatron_burst.launch.config.schema import load_config  # noqa: E402

GRAPHS = ["--cuda-graph-impl", "local"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=tuple(megatron_documents.SHAPES), default="small")
    megatron_e2e.run_args(parser, gpus=2, iters=10, timeout=200)
    parser.add_argument("--peak-tflops", type=float, default=989.0)
    parser.add_argument("--only", default="", help="run only the runs whose name has this")
    parser.add_argument("--documents", default=None, metavar="CAPACITY",
                        help="with document masks: whole_docs eager against pack_zigzag (its "
                        "boundaries padded to CAPACITY documents) eager and in CUDA graphs, "
                        "at CP=gpus and CP=1")
    args = parser.parse_args()
    head = megatron_e2e.result_head()
    base = load_config(megatron_e2e.CONFIG)
    plans = [(args.gpus, [], None)] + [(args.gpus, GRAPHS, None)]
    if args.shape == "small":
        plans += [(1, [], None), (1, GRAPHS, None)]
    if args.documents:
        plans = document_plans(args.gpus, int(args.documents))
    runs = []
    for cp, extra, docs in plans:
        cfg = megatron_documents.case_config(base, args.shape, cp, docs is not None,
                                             args.iters, None)
        if docs is not None:
            cfg = dataclasses.replace(cfg, data=dataclasses.replace(
                cfg.data, document_layout=docs[0], document_capacity=docs[1]))
        name = (f"{args.shape} CP={cp}" + (f", documents {docs[0]}" if docs else "")
                + (", CUDA graphs (local)" if extra else ", eager"))
        if args.only and args.only not in name:
            continue
        r = megatron_e2e.run(name, cp, extra, args.iters, args.timeout, cfg=cfg, keep_log=True)
        ms = megatron_e2e.steady_ms(r["ms_per_iter"], warmup=3)
        log = r.pop("log", "")
        if r["rc"]:  # the whole log of a failed run beside the results (its error's tail
            slug = "".join(c if c.isalnum() else "_" for c in name)  # is cut short)
            with open(os.path.splitext(args.out)[0] + f".{slug}.log", "w") as f:
                f.write(log)
        r.update(megatron_documents.run_figures(log, cfg.training.global_batch_size,
                                                ms, cp, args.peak_tflops))
        runs.append(r)
        megatron_e2e.save_runs(args.out, head, runs)
    lines = [f"{head['device']}, {head['date']}", f"command: `{head['command']}`", "",
             "| run | rc | ms/iter (steady) | MFU | losses (first 6) | error |",
             "|---|---|---|---|---|---|"]
    for r in runs:
        ms = f"{r['steady_ms']:.0f}" if r.get("steady_ms") else "-"
        mfu = f"{r['mfu']:.3f}" if r.get("mfu") else "-"
        losses = ", ".join(f"{x:.4f}" for x in r.get("losses", [])[:6])
        err = " ".join(r.get("error", [])[-2:])[:160]
        lines.append(f"| {r['name']} | {r['rc']} | {ms} | {mfu} | {losses} | {err} |")
    megatron_e2e.save_runs(args.out, head, runs, "\n".join(lines) + "\n")


def document_plans(gpus: int, capacity: int) -> list:
    """(CP, extra flags, (layout, capacity)) of the document runs: today's default eager, and
    pack_zigzag eager and captured, on ``gpus`` GPUs and on one."""
    zigzag = ("pack_zigzag", capacity)
    return [(gpus, [], ("whole_docs", None)), (gpus, [], zigzag), (gpus, GRAPHS, zigzag),
            (1, [], ("whole_docs", None)), (1, GRAPHS, zigzag)]


if __name__ == "__main__":
    main()
