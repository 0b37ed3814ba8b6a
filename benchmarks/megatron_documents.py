"""End to end with document masks: model FLOPs actually done, MFU, and the loss against CP=1.

    python benchmarks/megatron_documents.py --gpus 2 --out benchmarks/results/megatron_documents_h200x2.json

Runs `python -m megatron_burst.megatron.pretrain_gpt` (mock data; `--data` adds the sample
corpus) at two shapes, each with and without `--burst-document-mask`:

- small: 4 layers, hidden 1024, 16 heads / 4 groups, 16K tokens, global batch 4, at CP=2,
  and with masks at CP=1 too (its losses must equal CP=2's to bf16 tolerance);
- 1b: the Llama-3.2 1B shape (16 layers, hidden 2048, 32:8 heads) at 64K tokens, CP=2.

Megatron's logged TFLOP/s counts full causal attention over the whole sequence. Here model
FLOPs count what the step does: 6 x the matmul parameters per token, plus causal attention
over the pairs the masks leave (the entry point prints that share of full causal every few
packs), fwd+bwd = 3x fwd; MFU is that over the steady iteration time, the GPUs and the
GPU's dense bf16 peak (--peak-tflops, H200 / H100 SXM: 989).
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import megatron_e2e  # noqa: E402

from megatron_burst.launch.config import load_config  # noqa: E402

PAIRS = re.compile(r"causal attention pairs done: ([\d.]+) of full causal")
SHAPES = {
    "small": dict(num_layers=4, hidden_size=1024, ffn_hidden_size=4096, num_attention_heads=16,
                  num_query_groups=4, vocab_size=32000, seq_length=16384,
                  max_position_embeddings=16384, untie_embeddings=True),
    "1b": dict(seq_length=65536, max_position_embeddings=65536),  # the config's own model
}


def model_flops(model, tokens: int, pairs_share: float) -> float:
    """Training FLOPs of one sequence: matmuls 6 x params x tokens, causal attention over
    ``pairs_share`` of the full sequence's pairs (4 x hq x d per pair forward, x3)."""
    h, layers, hq, hkv = (model.hidden_size, model.num_layers, model.num_attention_heads,
                          model.num_query_groups)
    d = h // hq
    per_layer = h * (hq + 2 * hkv) * d + hq * d * h + 3 * h * model.ffn_hidden_size
    matmul = layers * per_layer + h * model.vocab_size
    pairs = pairs_share * tokens * (tokens + 1) / 2
    return 6.0 * matmul * tokens + 3.0 * layers * 4.0 * hq * d * pairs


def case_config(base, shape: str, cp: int, masks: bool, iters: int, data: str | None):
    model = dataclasses.replace(base.model, **SHAPES[shape])
    gbs = 4 if shape == "small" else 2
    d = dict(document_mask=masks)
    if data:
        d.update(mock=False, data_path=data + "/text_document",
                 tokenizer_type="HuggingFaceTokenizer", tokenizer_model=data + "/tokenizer",
                 split="100,0,0")
    return dataclasses.replace(
        base, model=model, data=dataclasses.replace(base.data, **d),
        parallel=dataclasses.replace(base.parallel, context=cp),
        cluster=dataclasses.replace(base.cluster, gpus_per_node=cp),
        training=dataclasses.replace(base.training, global_batch_size=gbs, train_iters=iters))


def measure(name: str, cfg, cp: int, masks: bool, args) -> dict:
    result = megatron_e2e.run(name, cp, [], args.iters, args.timeout, cfg=cfg, keep_log=True)
    log = result.pop("log", "")
    shares = [float(x) for x in PAIRS.findall(log)]
    share = shares[-1] if (masks and shares) else (1.0 if not masks else None)
    ms = megatron_e2e.steady_ms(result["ms_per_iter"], warmup=2)
    result.update(document_mask=masks, pairs_share=share)
    if ms is not None and share is not None:
        flops = cfg.training.global_batch_size * model_flops(cfg.model, cfg.model.seq_length,
                                                             share)
        result.update(model_tflops_per_gpu=flops / (ms / 1e3) / cp / 1e12,
                      mfu=flops / (ms / 1e3) / cp / (args.peak_tflops * 1e12),
                      steady_ms=ms)
    return result


def table(head: dict, runs: list[dict]) -> str:
    lines = [f"{head['device']}, {head['date']}", f"command: `{head['command']}`", "",
             "| run | GPUs | tokens/s | ms/iter | attention pairs done | model TFLOP/s/GPU "
             "(FLOPs done) | MFU | Megatron's TFLOP/s/GPU (full causal) | losses |",
             "|---|---|---|---|---|---|---|---|---|"]
    f = lambda r, k, fmt: fmt.format(r[k]) if r.get(k) is not None else "-"  # noqa: E731
    for r in runs:
        losses = ", ".join(f"{x:.4f}" for x in r.get("losses", [])[:6])
        lines.append(f"| {r['name']} | {r['gpus']} | {f(r, 'tokens_per_s', '{:.0f}')} | "
                     f"{f(r, 'steady_ms', '{:.0f}')} | {f(r, 'pairs_share', '{:.3f}')} | "
                     f"{f(r, 'model_tflops_per_gpu', '{:.0f}')} | {f(r, 'mfu', '{:.3f}')} | "
                     f"{f(r, 'tflops_per_gpu', '{:.0f}')} | {losses} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    megatron_e2e.run_args(parser, gpus=2, iters=8, timeout=240)
    parser.add_argument("--shapes", default="small,1b")
    parser.add_argument("--data", default=None, help="folder of `megatron-burst data "
                        "--sample-corpus` (real text instead of mock data)")
    parser.add_argument("--only", default="", help="run only the runs whose name has this")
    parser.add_argument("--peak-tflops", type=float, default=989.0)
    args = parser.parse_args()
    head = megatron_e2e.result_head()
    base = load_config(megatron_e2e.CONFIG)
    runs = []
    for shape in args.shapes.split(","):
        plans = [(args.gpus, False), (args.gpus, True)] + ([(1, True)] if shape == "small" else [])
        for cp, masks in plans:
            name = f"{shape} {SHAPES[shape]['seq_length'] // 1024}K CP={cp}" + (
                ", document masks" if masks else "") + (", real text" if args.data else "")
            if args.only and args.only not in name:
                continue
            cfg = case_config(base, shape, cp, masks, args.iters, args.data)
            runs.append(measure(name, cfg, cp, masks, args))
            megatron_e2e.save_runs(args.out, head, runs)
    megatron_e2e.save_runs(args.out, head, runs, table(head, runs))


if __name__ == "__main__":
    main()
