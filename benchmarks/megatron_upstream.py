"""Megatron-LM's own pretrain_gpt.py with patches/ applied, against this package's entry point.

    python benchmarks/megatron_upstream.py --megatron-lm /tmp/Megatron-LM --gpus 2 \
        --out benchmarks/results/megatron_upstream_h200x2.json

`--megatron-lm` is a Megatron-LM checkout at core_v0.19.0 with the patch applied (it is put
first on PYTHONPATH, so its megatron.core and megatron.training run). Same model, flags and
seed through both entry points (the small Llama shape: 4 layers, hidden 1024, 16:4 heads,
16K tokens, mock data, CP=2, 12 iterations):

1. default flags: upstream with its own default --create-attention-mask-in-dataloader (the
   patch turns the dense mask off), against the entry point: iteration time;
2. --burst-document-mask: the losses of both (equal to bf16 tolerance), and against 1;
3. full recompute with and without --burst-remat-aware, through both: the speedup;
4. document masks with layout pack_zigzag eager (with ``MEGATRON_BURST_REPLAY=auto`` in the
   environment its passes replay from the package's own graphs) and in Megatron's CUDA
   graphs (--cuda-graph-impl local), and a prefix-LM and a shared-question slice mask per micro-batch
   (--burst-mask-builder megatron_burst.megatron.mask_batches:prefix_lm, :shared_question):
   the losses of both ways in.
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

DENSE_OFF = "--no-create-attention-mask-in-dataloader"
GRAPHS = ("--cuda-graph-impl", "local")


def cases(base, gpus: int, iters: int):
    small = megatron_documents.case_config(base, "small", gpus, False, iters, None)
    masks = megatron_documents.case_config(base, "small", gpus, True, iters, None)
    full = dataclasses.replace(small, training=dataclasses.replace(small.training,
                                                                    recompute="full"))
    remat = dataclasses.replace(full, burst=dataclasses.replace(full.burst, remat_aware=True))
    # Documents the GPU reads, captured in Megatron's CUDA graphs (issue 39), and a slice mask
    # per micro-batch from a builder (issue 42): the same losses through both entry points.
    zigzag = dataclasses.replace(masks, data=dataclasses.replace(
        masks.data, document_layout="pack_zigzag", document_capacity=32))
    prefix, shared = (dataclasses.replace(small, data=dataclasses.replace(
        small.data, mask_builder=f"megatron_burst.megatron.mask_batches:{builder}"))
        for builder in ("prefix_lm", "shared_question"))
    return [("default flags", small, (DENSE_OFF,), ()), ("document masks", masks, (), ()),
            ("full recompute", full, (), ()), ("full recompute + remat-aware", remat, (), ()),
            ("documents pack_zigzag, eager", zigzag, (), ()),
            ("documents pack_zigzag, CUDA graphs", zigzag, (), GRAPHS),
            ("prefix-LM mask builder", prefix, (), ()),
            ("shared-question mask builder", shared, (), ())]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--megatron-lm", required=True)
    megatron_e2e.run_args(parser, gpus=2, iters=12, timeout=150)
    parser.add_argument("--only", default="", help="run only the cases whose name has this")
    parser.add_argument("--extra", default="", help="more Megatron flags for every run")
    args = parser.parse_args()
    head = megatron_e2e.result_head()
    lm = os.path.abspath(args.megatron_lm)
    upstream = dict(program=["pretrain_gpt.py"], cwd=lm, env_extra={
        "PYTHONPATH": os.pathsep.join([lm, megatron_e2e.ROOT, os.environ.get("PYTHONPATH", "")])})
    runs = []
    extra = args.extra.split()
    for name, cfg, drop, own in cases(load_config(megatron_e2e.CONFIG), args.gpus, args.iters):
        if args.only not in name:
            continue
        for way, kwargs in (("upstream pretrain_gpt.py + patch", dict(upstream, drop=drop)),
                            ("megatron_burst.megatron.pretrain_gpt", {})):
            label = f"{name}: {way}" + (f" {args.extra}" if extra else "")
            r = megatron_e2e.run(label, args.gpus, [*own, *extra], args.iters, args.timeout,
                                 cfg=cfg, keep_log=True, **kwargs)
            log = r.pop("log")
            r["burst_lines"] = [line.strip() for line in log.splitlines()
                                if line.startswith("> ") and ("BurstAttention" in line
                                                              or "document" in line
                                                              or "remat" in line
                                                              or "dense" in line)][:6]
            r["steady_ms"] = megatron_e2e.steady_ms(r["ms_per_iter"], warmup=2)
            runs.append(r)
            megatron_e2e.save_runs(args.out, head, runs)
    megatron_e2e.save_runs(args.out, head, runs, table(head, runs))


def table(head: dict, runs: list[dict]) -> str:
    lines = [f"{head['device']}, {head['date']}", f"command: `{head['command']}`", "",
             "| run | rc | ms/iter (steady) | losses (first 6) | last loss |",
             "|---|---|---|---|---|"]
    for r in runs:
        losses = r.get("losses", [])
        ms = f"{r['steady_ms']:.0f}" if r.get("steady_ms") else "-"
        lines.append(f"| {r['name']} | {r['rc']} | {ms} | "
                     f"{', '.join(f'{x:.4f}' for x in losses[:6])} | "
                     f"{losses[-1] if losses else '-'} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
