"""End-to-end Megatron runs on one GPU host: loss tracking, memory, CP against TP.

    python benchmarks/megatron_e2e.py --suite h200x4 --out benchmarks/results/megatron_h200x4.json
    python benchmarks/megatron_e2e.py --suite h200x8 --out benchmarks/results/megatron_h200x8.json

Suite h200x4:
1. A small Llama-style model (GQA, RMSNorm, SwiGLU, RoPE, mock data, bf16) trained for
   --iters iterations with `python -m megatron_burst.megatron.pretrain_gpt` at CP=1 (one GPU),
   CP=4 and TP=2 x CP=2, same global batch and seed: the loss curves, tokens/s and peak
   memory, from Megatron's own log lines.
2. configs/llama3.2-1b-128k-4gpu.yaml for a few iterations: Megatron's measured max
   allocated memory against `megatron-burst plan`'s estimate.

Suite h200x8: the Llama-3.2 1B shape (GQA 32:8, mock data, bf16) at 128K and 256K tokens,
CP=8 BurstAttention (configs/llama3.2-1b-256k-8gpu.yaml) against TP=8 + sequence parallelism
(configs/llama3.2-1b-256k-8gpu-tp8.yaml): tokens/s, Megatron's TFLOP/s per GPU, peak memory.

Every run's command, and a failed run's traceback, go into the JSON, which is rewritten after
each run so a run cut off by a time limit keeps what finished. With ``$MEGATRON_BURST_EMULATE``
set, every run's ranks emulate slower links between virtual nodes (the entry point's
``configure_run`` installs the emulator, burst or not), and the JSON records the variable.
The ranks run ``python -m`` in this repository, so they import its package whatever
``$PYTHONPATH`` says: to time another tree, run that tree's copy of this script from it.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from megatron_burst.launch.config.schema import load_config  # noqa: E402
from megatron_burst.launch.run.flags import megatron_flags  # noqa: E402
from megatron_burst.launch.planning.memory import estimate_memory  # noqa: E402

CONFIG = os.path.join(ROOT, "configs", "llama3.2-1b-128k-4gpu.yaml")
CP8_CONFIG = os.path.join(ROOT, "configs", "llama3.2-1b-256k-8gpu.yaml")
TP8_CONFIG = os.path.join(ROOT, "configs", "llama3.2-1b-256k-8gpu-tp8.yaml")
SMALL = ["--num-layers", "8", "--hidden-size", "1024", "--ffn-hidden-size", "4096",
         "--num-attention-heads", "16", "--num-query-groups", "4", "--seq-length", "16384",
         "--max-position-embeddings", "16384", "--vocab-size", "32000",
         "--untie-embeddings-and-output-weights"]
ITER = re.compile(r"iteration\s+(\d+)/\s*\d+ .*?elapsed time per iteration \(ms\): ([\d.]+)"
                  r".*?lm loss: ([\d.E+-]+)")
MEM = re.compile(r"max allocated: ([\d.]+)")
TFLOPS = re.compile(r"throughput per GPU \(TFLOP/s/GPU\): ([\d.]+)")


def _last_value(flags: list[str], flag: str) -> int:
    """The value Megatron's parser keeps for `flag`: its last occurrence."""
    return int(flags[len(flags) - 1 - flags[::-1].index(flag) + 1])


OWN_ENTRY = ["-m", "megatron_burst.megatron.pretrain_gpt"]


def run(name: str, nproc: int, extra: list[str], iters: int, timeout: int,
        config: str = CONFIG, cfg=None, keep_log: bool = False, program: list[str] = OWN_ENTRY,
        cwd: str = ROOT, env_extra: dict | None = None, drop: tuple[str, ...] = ()) -> dict:
    """One torchrun of `program` (default: this package's entry point) with the config's
    flags (less those in `drop`) and `extra`."""
    cfg = cfg or load_config(config)
    flags = [f for f in megatron_flags(cfg) if f not in drop] + extra + [
        "--train-iters", str(iters)]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc-per-node={nproc}", *program, *flags]
    env = {**os.environ, "CUDA_DEVICE_MAX_CONNECTIONS": "1", **(env_extra or {})}
    t0 = time.time()
    try:
        proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True,
                              timeout=timeout)
        log, rc = proc.stdout + proc.stderr, proc.returncode
    except subprocess.TimeoutExpired as e:
        log, rc = (e.stdout or b"").decode() + (e.stderr or b"").decode(), "timeout"
    iters_seen = [(int(i), float(ms), float(loss)) for i, ms, loss in ITER.findall(log)]
    mem = [float(m) for m in MEM.findall(log)]
    tflops = [float(x) for x in TFLOPS.findall(log)]
    topology = [line for line in log.splitlines() if "context parallelism" in line][:1]
    seq, gbs = _last_value(flags, "--seq-length"), _last_value(flags, "--global-batch-size")
    # Iterations 1-2 hold kernel probing, Triton compiles and allocator growth.
    steady = [ms for i, ms, _ in iters_seen if i > 2]
    tokens_s = gbs * seq / (sum(steady) / len(steady) / 1e3) if steady else None
    steady_tflops = tflops[2:] if len(tflops) > 2 else []
    print(f"{name}: rc={rc} {len(iters_seen)} iterations, last loss "
          f"{iters_seen[-1][2] if iters_seen else None}, tokens/s {tokens_s}, "
          f"max allocated MB {max(mem) if mem else None} ({time.time() - t0:.0f}s)", flush=True)
    return dict(name=name, gpus=nproc, rc=rc, command=" ".join(cmd), topology=topology,
                seq_length=seq, global_batch_size=gbs, config=os.path.relpath(config, ROOT),
                tflops_per_gpu=sum(steady_tflops) / len(steady_tflops) if steady_tflops else None,
                losses=[loss for _, _, loss in iters_seen],
                ms_per_iter=[ms for _, ms, _ in iters_seen], tokens_per_s=tokens_s,
                max_allocated_MiB=max(mem) if mem else None,
                error=_first_traceback(log) if rc != 0 else [], **({"log": log} if keep_log else {}))


def _first_traceback(log: str) -> list[str]:
    """A failed run's first rank traceback (not torchrun's own report), else its tail."""
    lines = log.splitlines()
    said = [line for line in lines if line.startswith("error:")]  # the entry point's one line
    if said:
        return said[:4]
    starts = [i for i, line in enumerate(lines) if "Traceback" in line]
    for i in starts:
        chunk = lines[i:i + 60]
        if not any("torch/distributed/run.py" in line for line in chunk[:8]):
            return chunk
    return [line for line in lines if "Error" in line][-20:] + lines[-20:]


def suite_h200x4(args: argparse.Namespace) -> dict:
    """Loss curves at CP=1/4 and TP2xCP2, then the memory plan against the measured peak."""
    small = SMALL + ["--global-batch-size", "4", "--micro-batch-size", "1"]
    plans = [("cp1", 1, ["--context-parallel-size", "1"]),
             ("cp4", 4, ["--context-parallel-size", "4"]),
             # As recorded in megatron_h200x4.json: without --sequence-parallel (that run
             # predates SequenceParallelTorchNorm, when torch norms refused it).
             ("tp2xcp2", 4, ["--context-parallel-size", "2", "--tensor-model-parallel-size", "2"])]
    runs = []
    for name, nproc, extra in plans:
        runs.append(run(name, nproc, small + extra, args.iters, 240))
        if runs[-1]["rc"] != 0:  # the same error would repeat: stop and report it
            print("\n".join(runs[-1]["error"]))
            sys.exit(1)
    # The plan's memory estimate against the measured peak, at the config's own shape.
    mem_run = run("plan-check llama3.2-1b 128K CP=4", 4,
                  ["--global-batch-size", "1", "--micro-batch-size", "1"], 3, 300)
    return dict(runs=runs, memory_check=memory_check(load_config(CONFIG), mem_run))


def suite_h200x8(args: argparse.Namespace, save) -> dict:
    """CP=8 BurstAttention against TP=8 + SP, same 1B GQA model, at each of --seqs tokens."""
    runs, checks = [], []
    for seq in (int(x) for x in args.seqs.split(",")):
        for name, config in (("cp8 burst", CP8_CONFIG), ("tp8+sp", TP8_CONFIG)):
            extra = ["--seq-length", str(seq), "--max-position-embeddings", str(seq),
                     "--global-batch-size", "1"]
            runs.append(run(f"{name} {seq // 1024}K", 8, extra, args.iters, args.timeout,
                            config=config))
            cfg = load_config(config)
            cfg = dataclasses.replace(cfg, model=dataclasses.replace(
                cfg.model, seq_length=seq, max_position_embeddings=seq))
            checks.append(memory_check(cfg, runs[-1]))
            save(dict(runs=runs, memory_checks=checks))
    return dict(runs=runs, memory_checks=checks)


def suite_features(args: argparse.Namespace, save) -> dict:
    """Issues 12, 15, 16 (--part train): the Llama-3.2 1B shape at 128K, CP=4, on real text
    (the offline sample of `megatron-burst data --sample-corpus`): without and with document
    masks, and with document masks under full recompute, with and without remat-aware
    recompute. Issue 14 (--part ckpt): a distributed checkpoint saved at CP=4 and resumed at
    CP=4 (requeue-style, optimizer too), TP2xCP2 and CP=1 (weights: the next loss)."""
    runs, g = [], args.gpus
    if args.part == "train":
        base = load_config(CONFIG)
        if g != 4:  # the config's 32K tokens per GPU on g GPUs: CP=g, 32K x g tokens
            seq = 32768 * g
            base = dataclasses.replace(
                base, model=dataclasses.replace(base.model, seq_length=seq,
                                                max_position_embeddings=seq),
                parallel=dataclasses.replace(base.parallel, context=g),
                cluster=dataclasses.replace(base.cluster, gpus_per_node=g))
        data = dataclasses.replace(base.data, mock=False, data_path=args.data + "/text_document",
                                   tokenizer_type="HuggingFaceTokenizer",
                                   tokenizer_model=args.data + "/tokenizer", split="100,0,0")
        k = f"{base.model.seq_length // 1024}K CP={g}"
        if args.remat_only:  # full recompute, with and without remat, on the whole sequence
            cases = [(f"{k} real text, full recompute", {}, {"recompute": "full"}, {}),
                     (f"{k} real text, full recompute + remat-aware", {},
                      {"recompute": "full"}, {"remat_aware": True})]
        else:
            cases = []
        cases = cases or [(f"{k} real text", {}, {}, {}),
                 (f"{k} real text, document masks", {"document_mask": True}, {}, {}),
                 (f"{k} document masks, full recompute", {"document_mask": True},
                  {"recompute": "full"}, {}),
                 (f"{k} document masks, full recompute + remat-aware", {"document_mask": True},
                  {"recompute": "full"}, {"remat_aware": True})]
        for name, d, tr, b in cases:
            cfg = dataclasses.replace(
                base, data=dataclasses.replace(data, **d),
                training=dataclasses.replace(base.training, global_batch_size=1,
                                             train_iters=args.iters, **tr),
                burst=dataclasses.replace(base.burst, **b))
            runs.append(run(name, g, [], args.iters, args.timeout, cfg=cfg))
            runs[-1]["memory_check"] = memory_check(cfg, runs[-1])
            save(dict(runs=runs))
        return dict(runs=runs)
    ckpt = os.path.join(args.workdir, "ckpt")
    small = SMALL + ["--global-batch-size", "1", "--micro-batch-size", "1"]
    save_flags = ["--save", ckpt, "--save-interval", "4", "--ckpt-format", args.ckpt_format]
    load_flags = ["--load", ckpt, "--ckpt-format", args.ckpt_format]
    cp = ["--context-parallel-size", str(g)]
    other = ["--context-parallel-size", str(g // 2), "--tensor-model-parallel-size", "2"]
    plans = [(f"cp{g}: 6 iterations, saves at 4", g, cp + save_flags),
             (f"cp{g} resumed at 4 (requeue)", g, cp + load_flags),
             (f"tp2xcp{g // 2} resumed at 4", g, other + ["--no-load-optim", "--no-load-rng"]
              + load_flags),
             ("cp1 resumed at 4 (one GPU)", 1, ["--context-parallel-size", "1",
                                                 "--no-load-optim", "--no-load-rng"] + load_flags)]
    for i, (name, nproc, extra) in enumerate(plans[:2] if args.resume_only else plans):
        runs.append(run(name, nproc, small + extra, 6, args.timeout))
        if i == 0:  # resume from iteration 4, as a requeued job would from its last save
            with open(os.path.join(ckpt, "latest_checkpointed_iteration.txt"), "w") as f:
                f.write("4")
        save(dict(runs=runs))
    return dict(runs=runs)


def memory_check(cfg, mem_run: dict) -> dict:
    """`megatron-burst plan`'s memory estimate for `cfg` against a run's measured peak.

    Megatron's "max allocated" is the caching allocator's peak: it is compared with the plan
    less its reserve for the CUDA context, NCCL and fragmentation (not allocations).
    """
    est = estimate_memory(cfg)
    planned = (est.total - est.reserved) / 2**20
    measured = mem_run["max_allocated_MiB"]
    print(f"memory ({mem_run['name']}): planned {planned:.0f} MiB, measured {measured} MiB",
          flush=True)
    return dict(run=mem_run["name"], plan_MiB={k: v / 2**20 for k, v in est.rows()},
                planned_allocations_MiB=planned, measured_max_allocated_MiB=measured,
                error=None if not measured else (planned - measured) / measured)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suite", choices=("h200x4", "h200x8", "features"), default="h200x4")
    parser.add_argument("--part", choices=("train", "ckpt"), default="train",
                        help="features: the training runs or the checkpoint runs")
    parser.add_argument("--data", default="data/sample",
                        help="features: folder of `megatron-burst data --sample-corpus`")
    parser.add_argument("--workdir", default="/tmp/megatron_e2e", help="features: checkpoints")
    parser.add_argument("--gpus", type=int, default=4, help="features: GPUs (CP size)")
    parser.add_argument("--ckpt-format", default="torch_dist", help="features --part ckpt")
    parser.add_argument("--remat-only", action="store_true",
                        help="features --part train: only full recompute with/without remat")
    parser.add_argument("--resume-only", action="store_true",
                        help="features --part ckpt: save, then only the resume at the same "
                             "parallel setup")
    parser.add_argument("--out", required=True)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--seqs", default="131072,262144", help="h200x8: sequence lengths")
    parser.add_argument("--timeout", type=int, default=240, help="h200x8: seconds per run")
    args = parser.parse_args()
    head = result_head()

    def save(result: dict) -> None:
        with open(args.out, "w") as f:
            json.dump({**head, **result}, f, indent=1)

    if args.suite == "features":
        save(suite_features(args, save))
    else:
        save(suite_h200x4(args) if args.suite == "h200x4" else suite_h200x8(args, save))


def _device() -> str:
    import torch
    return f"{torch.cuda.get_device_name(0)} x{torch.cuda.device_count()}"


def run_args(parser: argparse.ArgumentParser, gpus: int, iters: int, timeout: int) -> None:
    """The options every per-run Megatron benchmark takes (GPUs, length, limit, output)."""
    parser.add_argument("--gpus", type=int, default=gpus)
    parser.add_argument("--iters", type=int, default=iters)
    parser.add_argument("--timeout", type=int, default=timeout, help="seconds per run")
    parser.add_argument("--out", required=True)


def steady_ms(ms_per_iter: list[float], warmup: int) -> float | None:
    """Mean ms per iteration after the first `warmup` (compilation, allocator, capture)."""
    steady = ms_per_iter[warmup:]
    return sum(steady) / len(steady) if steady else None


def result_head() -> dict:
    """What every results file opens with: the device, the date, the exact command and the
    link emulation its ranks run under (``configure_run`` installs it), if any."""
    return dict(device=_device(), date=time.strftime("%Y-%m-%d %H:%M:%S"),
                command=" ".join([sys.executable] + sys.argv),
                emulate=os.environ.get("MEGATRON_BURST_EMULATE"))


def save_runs(out: str, head: dict, runs: list[dict], table: str | None = None) -> None:
    """Write the runs so far as JSON (after each run, so a time-out keeps what finished);
    with `table`, also the Markdown table beside it, and print it."""
    with open(out, "w") as f:
        json.dump(dict(head, runs=runs), f, indent=1)
    if table is not None:
        with open(os.path.splitext(out)[0] + ".md", "w") as f:
            f.write(table)
        print(table)


if __name__ == "__main__":
    main()
