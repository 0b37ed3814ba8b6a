"""End-to-end training runs on file (benchmarks/results/megatron_*.json) as configs the planner
can predict, with what was measured.

Every run recorded its exact Megatron command line; that, not the config file it started
from, is what ran (the benchmarks override layers, sequence and batch), so the config here is
read back from the command, the last occurrence of a flag winning as in Megatron's parser.
Runs the planner does not model are left out, each with its reason: failed runs, document
masks (their attention does a fraction of the causal FLOPs), CUDA graphs (no host time),
upstream `pretrain_gpt.py` (another data path), runs that saved checkpoints (a save's time
is in their steady step) and runs resumed from one.
"""
from __future__ import annotations

import dataclasses
import json
import shlex
from pathlib import Path
from typing import Any

from ..launch.config.schema import Config, config_from_dict

ENTRY_MODULES = ("megatron_burst.megatron.pretrain_gpt", "megatron_burst.pretrain_gpt")
# Flags whose runs the planner does not model, and why.
UNMODELLED = {
    "--burst-document-mask": "document masks (attention does a fraction of the causal FLOPs)",
    "--cuda-graph-impl": "CUDA graphs (the planner times eager steps)",
    "--save": "saves checkpoints (the save is in the measured step)",
    "--load": "resumes from a checkpoint (too few steps after the load for a steady step)",
}
DEVICES = {"H200": "h200-141gb", "H100": "h100-80gb", "A100": "a100-80gb"}


@dataclasses.dataclass(frozen=True)
class MeasuredRun:
    """One end-to-end run: what ran, on what, and its steady step time."""

    source: str  # results file name
    name: str
    cfg: Config
    step_s: float  # measured: tokens per step over the steady tokens/s


def megatron_flags_of(command: str) -> dict[str, list[str]] | None:
    """The flags after the entry point's module in ``command``; None for another program."""
    words = shlex.split(command)
    starts = [i + 1 for i, w in enumerate(words) if w in ENTRY_MODULES and words[i - 1] == "-m"]
    if not starts:
        return None
    flags: dict[str, list[str]] = {}
    key = None
    for word in words[starts[0]:]:
        if word.startswith("--"):
            key = word
            flags[key] = []  # a repeated flag: the last one wins, as in argparse
        elif key is not None:
            flags[key].append(word)
    return flags


def _config(flags: dict[str, list[str]], gpus: int, gpu: str) -> Config:
    """The planner's config of a run's flags (what the planner reads of them)."""
    def num(flag: str, default: int | None = None) -> int:
        return int(flags[flag][0]) if flag in flags else default

    tp, cp = num("--tensor-model-parallel-size", 1), num("--context-parallel-size", 1)
    pp = num("--pipeline-model-parallel-size", 1)
    heads = num("--num-attention-heads")
    recompute = flags.get("--recompute-granularity", ["none"])[0]
    return config_from_dict({
        "model": {"name": "measured", "num_layers": num("--num-layers"),
                  "hidden_size": num("--hidden-size"), "ffn_hidden_size": num("--ffn-hidden-size"),
                  "num_attention_heads": heads,
                  "num_query_groups": num("--num-query-groups", heads),
                  # Runs on real text name no --vocab-size: the sample tokenizer's 1024.
                  "vocab_size": num("--vocab-size", 1024), "seq_length": num("--seq-length"),
                  "untie_embeddings": "--untie-embeddings-and-output-weights" in flags},
        "parallel": {"tensor": tp, "context": cp, "pipeline": pp, "data": gpus // (tp * cp * pp),
                     "sequence_parallel": "--sequence-parallel" in flags},
        "burst": {"backward": flags.get("--burst-backward", ["auto"])[0],
                  "ulysses_size": num("--burst-ulysses-size", 1),
                  "remat_aware": "--burst-remat-aware" in flags},
        "cluster": {"nodes": 1, "gpus_per_node": gpus, "gpu": gpu},
        "training": {"micro_batch_size": num("--micro-batch-size"),
                     "global_batch_size": num("--global-batch-size"), "train_iters": 1,
                     "recompute": recompute,
                     "precision": "bf16" if "--bf16" in flags else "fp32"},
    })


def why_unmodelled(run: dict[str, Any], flags: dict[str, list[str]] | None) -> str | None:
    """Why the planner cannot be compared with ``run`` (None: it can)."""
    if run.get("rc") != 0 or not run.get("tokens_per_s"):
        return "did not finish"
    if flags is None:
        return "another entry point (upstream pretrain_gpt.py)"
    return next((why for flag, why in UNMODELLED.items() if flag in flags), None)


def read_runs(results: Path) -> tuple[list[MeasuredRun], list[tuple[str, str]]]:
    """(the comparable runs of every megatron_*.json under ``results``, (run, why) for the
    rest)."""
    used, skipped = [], []
    for path in sorted(results.glob("megatron_*.json")):
        head = json.loads(path.read_text())
        device = head.get("device", "an unnamed device")
        gpu = next((kind for name, kind in DEVICES.items() if name in device), None)
        for run in head["runs"]:
            label = f"{path.name}: {run['name']}"
            flags = megatron_flags_of(run.get("command", ""))
            why = why_unmodelled(run, flags) or (None if gpu else f"device {device}")
            if why:
                skipped.append((label, why))
                continue
            cfg = _config(flags, run["gpus"], gpu)
            tokens = cfg.model.seq_length * cfg.training.global_batch_size
            used.append(MeasuredRun(path.name, run["name"], cfg, tokens / run["tokens_per_s"]))
    return used, skipped
