"""Where an eager forward's host time goes, with native frames: py-spy on each rank.

    torchrun --nproc_per_node=2 benchmarks/native_profile.py --out $OUT/native  # py-spy on PATH
    python benchmarks/native_profile.py --summarize $OUT/native   # again, on any machine

Why: at 8K tokens per GPU one rank's host bounds the eager forward of the document families
(``gpu_timeline.py``), and the profilers tried before misled. cProfile charged the process
group's pybind calls to their callers (``post_ops`` 0.57 ms a hop against 50-65 us timed
alone), and torch.profiler sees ops, not the Python between them. py-spy samples the whole
stack, Python and native, without instrumenting calls: the package's frames, torch's
dispatcher, cuDNN's frontend, Triton's launcher and the CUDA driver each get their share.

Each rank attaches ``py-spy record --native`` to itself (a child may read its parent on
these machines) for a number of eager forwards back to back that rank 0 picks from its own
unprofiled time and every rank runs (a count by time would differ by rank and hang the
ring). py-spy pauses the process at each sample, so a profiled forward takes about twice as
long: the shares are what to read, not the milliseconds. Writes ``FAMILY_rRANK.txt`` (raw
collapsed stacks), ``FAMILY_rRANK.json`` (the timings) and ``summary.md`` / ``summary.json``:
each forward's samples by category (``CATEGORIES``: the first that its stack matches), made
by rank 0 from the files in ``--out`` (one node: every rank's are there). Its run on 2x H200:
``results/h200x2_issue42_native_profile/`` (the raw stacks in ``stacks.tgz``).
"""
from __future__ import annotations

import argparse
import collections
import datetime
import glob
import json
import os
import shutil
import subprocess
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import megatron_burst as mb  # noqa: E402
from slice_masks import HOST_BOUND, add_shape_args, family_mask  # noqa: E402

# (category, what a Python frame's function name starts with, what its file's path holds): a
# sample goes to the first category, in this order, that any frame of its stack matches: the
# specific before the general, so a cuDNN call inside the first call's home counts as cuDNN,
# and a merge's launch inside its fold as the launch ('fold_rows' is not the view '_rows').
# 'ring', 'kernel calls' and 'call' take what the package does around them.
CATEGORIES = (
    ("cudnn", "CudnnAttention.", "kernels/cuda"),
    ("flash", "TorchFlashAttention.", "kernels/cuda"),
    ("flash", "FlashAttnPackage.", "kernels/cuda"), ("flex", "", "megatron_burst/kernels/flex"),
    ("gather", "gather (", "kernels/varlen"), ("views", "_rows (", "kernels/run_calls"),
    ("views", "_lse_rows (", "kernels/run_calls"), ("views", "_heads (", "kernels/protocol"),
    ("merge launch", "_launch (", "kernels/merge"), ("merge", "", "megatron_burst/kernels/merge"),
    ("send", "post_ops (", "comm/messages"), ("pack", "PayloadRing._pack", "comm/rings"),
    ("pack", "RowShape.", "comm/rings"), ("wait", "PayloadRing.next", "comm/rings"),
    ("headers", "", "megatron_burst/comm/headers"),
    ("consensus", "", "megatron_burst/comm/consensus"), ("ring", "", "megatron_burst/comm/"),
    ("home", "", "megatron_burst/attention/home_output"),
    ("kernel calls", "", "megatron_burst/kernels/"), ("call", "", "megatron_burst/"),
)


MARKER = "eager_forward ("  # the frame every counted sample sits under


def eager_forward(q, k, v, mask) -> None:
    """One forward without autograd, as profiled."""
    with torch.no_grad():
        mb.burst_attn(q, k, v, mask=mask)


def categorise(lines, marker: str = MARKER) -> tuple[int, collections.Counter]:
    """(samples under a frame that starts with ``marker``, their count by category) from
    py-spy's raw lines ('frame;frame;... count'); a sample no category matches is 'other'."""
    total, counts = 0, collections.Counter()
    for line in lines:
        stack, _, n = line.rstrip().rpartition(" ")
        if not stack or not n.isdigit():
            continue
        frames = [f for f in stack.split(";") if ".py:" in f]
        if not any(f.startswith(marker) for f in frames):
            continue
        total += int(n)
        found = next((name for name, func, path in CATEGORIES
                      if any(f.startswith(func) and path in f for f in frames)), "other")
        counts[found] += int(n)
    return total, counts


def summarize(folder: str, marker: str = MARKER) -> str:
    """``summary.md`` and ``summary.json`` in ``folder`` from its raw files; returns the text."""
    rows = []
    for path in sorted(glob.glob(os.path.join(folder, "*_r[0-9]*.txt"))):
        with open(path) as f:
            total, counts = categorise(f, marker)
        meta_path = path[:-4] + ".json"
        meta = {}
        if os.path.exists(meta_path):
            with open(meta_path) as f:
                meta = json.load(f)
        rows.append(dict(profile=os.path.basename(path)[:-4], samples=total,
                         share={k: c / total for k, c in counts.items()} if total else {},
                         **{k: meta[k] for k in ("ms", "ms_profiled", "cpu_ms") if k in meta}))
    names = list(dict.fromkeys(name for name, *_ in CATEGORIES)) + ["other"]
    lines = ["Share of each forward's samples (%), by the first category its stack matches "
             "(`native_profile.CATEGORIES`).", "",
             "| profile | samples | ms a forward | " + " | ".join(names) + " |",
             "|---" * (len(names) + 3) + "|"]
    for r in rows:
        cells = [f"{100 * r['share'].get(n, 0):.0f}" for n in names]
        lines.append(f"| {r['profile']} | {r['samples']} | {r.get('ms', float('nan')):.3f} | "
                     + " | ".join(cells) + " |")
    text = "\n".join(lines)
    with open(os.path.join(folder, "summary.json"), "w") as f:
        json.dump(dict(categories=CATEGORIES, rows=rows), f, indent=1)
    with open(os.path.join(folder, "summary.md"), "w") as f:
        f.write(text + "\n")
    return text


def profile(args) -> None:
    """Each family: warm up, time, then py-spy over an agreed count of forwards."""
    from host_cores import python_ms
    from ranks import start_ranks

    spy = args.py_spy or shutil.which("py-spy")
    if spy is None:
        raise SystemExit("native_profile.py: py-spy not found (pip install py-spy, or "
                         "--py-spy PATH)")
    rank, world = start_ranks()
    dev = torch.device("cuda", torch.cuda.current_device())
    os.makedirs(args.out, exist_ok=True)
    for name in args.families.split(","):
        total = args.tokens * world
        mask = family_mask(name, total)
        gen = torch.Generator(device=dev).manual_seed(1)
        q, k, v = (mb.shard_seq(torch.randn(1, total, h, args.d, device=dev, generator=gen,
                                            dtype=torch.bfloat16), mask=mask).contiguous()
                   for h in (args.hq, args.hkv, args.hkv))

        def ms_a_forward(n: int) -> float:
            torch.cuda.synchronize()
            dist.barrier()
            t0 = time.perf_counter()
            for i in range(n):
                eager_forward(q, k, v, mask)
                if i % 15 == 14:  # as a model's layers call it: the host runs ahead a little
                    torch.cuda.synchronize()
            torch.cuda.synchronize()
            return (time.perf_counter() - t0) / n * 1e3

        for _ in range(5):
            eager_forward(q, k, v, mask)
        rec = dict(family=name, rank=rank, ms=ms_a_forward(60), cpu_ms=python_ms(3, 100_000))
        count = [max(15, int(args.seconds * 500 / rec["ms"]))]  # about half the time: py-spy
        dist.broadcast_object_list(count, src=0)                # slows the host about 2x
        path = os.path.join(args.out, f"{name}_r{rank}.txt")
        spy_run = subprocess.Popen(
            [spy, "record", "--pid", str(os.getpid()), "--native", "--rate", str(args.rate),
             "--duration", str(args.seconds + 2), "--format", "raw", "--output", path],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        time.sleep(1.0)  # attached before the forwards start
        rec["ms_profiled"], rec["forwards"] = ms_a_forward(count[0]), count[0]
        rec["py_spy"] = spy_run.communicate(timeout=60)[0].decode(errors="replace")[-400:]
        with open(path[:-4] + ".json", "w") as f:
            json.dump(rec, f, indent=1)
        dist.barrier()
    if rank == 0:
        print(summarize(args.out))
        with open(os.path.join(args.out, "command.txt"), "w") as f:
            f.write(f"{datetime.date.today()} {torch.cuda.get_device_name()} x{world}: "
                    f"{' '.join(sys.argv)}\n")
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", help="folder for the raw stacks and the summary")
    p.add_argument("--summarize", metavar="FOLDER", help="only summarise FOLDER's raw stacks")
    add_shape_args(p, HOST_BOUND)
    p.add_argument("--seconds", type=int, default=8, help="profiled seconds a family")
    p.add_argument("--rate", type=int, default=200, help="py-spy samples a second")
    p.add_argument("--py-spy", default=None, help="py-spy's path (default: on PATH)")
    p.add_argument("--marker", default=MARKER, help="--summarize: the frame samples sit under")
    args = p.parse_args()
    for name in ("seconds", "rate", "tokens"):  # before the ranks start: no rank waits
        if getattr(args, name) < 1:
            p.error(f"--{name} must be at least 1, got {getattr(args, name)}")
    if args.summarize:
        print(summarize(args.summarize, args.marker))
    elif args.out:
        profile(args)
    else:
        p.error("give --out (profile, under torchrun) or --summarize FOLDER")


if __name__ == "__main__":
    main()
