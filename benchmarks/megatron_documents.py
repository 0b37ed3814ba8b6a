"""End to end with document masks: model FLOPs actually done, MFU, and the loss against CP=1.

    python benchmarks/megatron_documents.py --gpus 2 --out benchmarks/results/megatron_documents_h200x2.json
    python benchmarks/megatron_documents.py --gpus 1 --shapes small --only "CP=1, document" \
        --prefetch both --trace /tmp/burst_trace --out /tmp/megatron_documents_trace.json

Runs `python -m megatron_burst.megatron.pretrain_gpt` (mock data; `--data` adds the sample
corpus) at two shapes, each with and without `--burst-document-mask`:

- small: 4 layers, hidden 1024, 16 heads / 4 groups, 16K tokens, global batch 4, at CP=2,
  and at CP=1 too, with and without masks (the masked losses must equal CP=2's to bf16
  tolerance; the steps are what CP=2 buys over one GPU);
- 1b: the Llama-3.2 1B shape (16 layers, hidden 2048, 32:8 heads) at 64K tokens, CP=2.

Megatron's logged TFLOP/s counts full causal attention over the whole sequence. Here model
FLOPs are the run's own count, which the entry point prints (``megatron_burst.decide.flops``, read
back with ``flops.read_flops``): its padded vocabulary (the tokenizer's, not the config's,
on real text), GQA, SwiGLU, the causal attention pairs its documents leave, fwd+bwd = 3x
fwd; "with recompute" adds what recompute repeats. MFU is model FLOPs over the steady
iteration time, the GPUs and the GPU's dense bf16 peak (--peak-tflops, H200 / H100 SXM: 989).

``--prefetch both`` runs each masked case with the document batches made ahead on the
background thread (the default) and on the step ($MEGATRON_BURST_PREFETCH=0). ``--trace
DIR`` records a torch.profiler trace of micro-batches 4-6 of every run, all threads
included, as DIR/<run>/rank<R>.json (``megatron_burst.megatron.trace``): the prefetch
thread's "megatron_burst: make batch" ranges run beside the step's kernels, and "take
batch" is what the step waits for its batch.
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

from megatron_burst.decide.flops import read_flops  # noqa: E402
from megatron_burst.launch.config.schema import load_config  # noqa: E402

PAIRS = re.compile(r"causal attention pairs done: ([\d.]+) of full causal")
SHAPES = {
    "small": dict(num_layers=4, hidden_size=1024, ffn_hidden_size=4096, num_attention_heads=16,
                  num_query_groups=4, vocab_size=32000, seq_length=16384,
                  max_position_embeddings=16384, untie_embeddings=True),
    "1b": dict(seq_length=65536, max_position_embeddings=65536),  # the config's own model
}


def run_figures(log: str, gbs: int, ms: float | None, gpus: int, peak_tflops: float) -> dict:
    """Model TFLOP/s per GPU and MFU of a run from the FLOPs per sequence it printed (its own
    count of what it does), its global batch, its steady ms per iteration and its GPUs."""
    counted = read_flops(log)
    if counted is None or ms is None:
        return {}
    per_s = gbs * counted.model / (ms / 1e3) / gpus
    return dict(model_flops_per_sequence=counted.model,
                flops_with_recompute_per_sequence=counted.hardware,
                model_tflops_per_gpu=per_s / 1e12, mfu=per_s / (peak_tflops * 1e12),
                steady_ms=ms)


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


def measure(name: str, cfg, cp: int, masks: bool, args, env: dict) -> dict:
    result = megatron_e2e.run(name, cp, [], args.iters, args.timeout, cfg=cfg, keep_log=True,
                              env_extra=env)
    log = result.pop("log", "")
    shares = [float(x) for x in PAIRS.findall(log)]
    share = shares[-1] if (masks and shares) else (1.0 if not masks else None)
    ms = megatron_e2e.steady_ms(result["ms_per_iter"], warmup=2)
    result.update(document_mask=masks, pairs_share=share, env=env,
                  **run_figures(log, cfg.training.global_batch_size, ms, cp, args.peak_tflops))
    return result


def run_env(args, name: str, masks: bool, prefetch: bool) -> dict:
    """The environment of one run: the prefetch switch, and where its trace goes."""
    env = {} if prefetch else {"MEGATRON_BURST_PREFETCH": "0"}
    if args.trace and masks:  # traced where document batches are taken
        slug = re.sub(r"[^A-Za-z0-9]+", "_", name).strip("_")
        env["MEGATRON_BURST_TRACE"] = os.path.join(os.path.abspath(args.trace), slug) + ":4:3"
    return env


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
    parser.add_argument("--prefetch", choices=("on", "off", "both"), default="on",
                        help="masked runs: document batches made ahead (on), on the step "
                        "(off), or each run both ways")
    parser.add_argument("--trace", default=None, help="folder for a torch.profiler trace "
                        "of micro-batches 4-6 of every run (Chrome JSON per rank)")
    args = parser.parse_args()
    head = megatron_e2e.result_head()
    base = load_config(megatron_e2e.CONFIG)
    runs = []
    ways = {"on": (True,), "off": (False,), "both": (True, False)}[args.prefetch]
    for shape in args.shapes.split(","):
        plans = [(args.gpus, False), (args.gpus, True)] + (
            [(1, False), (1, True)] if shape == "small" and args.gpus > 1 else [])
        for cp, masks in plans:
            for ahead in (ways if masks else (True,)):
                name = f"{shape} {SHAPES[shape]['seq_length'] // 1024}K CP={cp}" + (
                    ", document masks" if masks else "") + (", real text" if args.data else "") + (
                    "" if ahead or not masks else ", made on the step")
                if args.only and args.only not in name:
                    continue
                cfg = case_config(base, shape, cp, masks, args.iters, args.data)
                runs.append(measure(name, cfg, cp, masks, args, run_env(args, name, masks, ahead)))
                megatron_e2e.save_runs(args.out, head, runs)
    megatron_e2e.save_runs(args.out, head, runs, table(head, runs))


if __name__ == "__main__":
    main()
