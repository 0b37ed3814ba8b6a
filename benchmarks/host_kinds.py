"""Does a tiny call's host time stand for a real call's? (run with torchrun on 2 GPUs)

    torchrun --nproc_per_node=2 benchmarks/host_kinds.py --out OUT

For each kind of call the time model prices (flat ring with the ring or the burst backward,
Ulysses over the group; a plain causal sequence, or a new pack of ``auto_check``'s document
mix every call), the median host milliseconds of a fwd+bwd (until it returned to Python,
``attention.measure.host_rounds``) at three sizes: tiny (64 tokens a rank, ``world`` heads
of 64, the first use's tiny call, bf16), 8K and 32K tokens a GPU (32:32 heads of 128, bf16,
``auto_check``'s cells). Under ``MEGATRON_BURST_EMULATE`` the links are emulated, as in
``auto_check_three.sh``. Rank 0 writes OUT/host_kinds[_emulated].json and prints a table.
``--ops``: for each kind on document packs, the host operators whose own time grows most
from the tiny call to 8K (``torch.profiler``): Ulysses' host time on packs grows with tokens
(9.3-11.4 ms at 8K against 6.2-7.0 for the tiny pack, ``results/h100x2_issue41_settled``).
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from auto_check import doc_lens, pack_order  # noqa: E402
from op_spans import profiled_calls  # noqa: E402
from ranks import EMULATE_ENV, ran_package, start_ranks  # noqa: E402

KINDS = {"ring bwd": dict(ulysses_size=1, backward="ring"),
         "burst bwd": dict(ulysses_size=1, backward="burst"),
         "ulysses": dict(ulysses_size=2, backward="ring")}


def _call(per_gpu: int, heads: tuple[int, int], d: int, world: int, docs: bool, kw: dict,
          device):
    """A fwd+bwd of one kind at one size; with ``docs``, a new pack every call."""
    import megatron_burst as mb

    gen = torch.Generator(device="cpu").manual_seed(0)
    full = [torch.randn(1, per_gpu * world, h, d, generator=gen).to(device, torch.bfloat16)
            for h in (heads[0], heads[1], heads[1])]
    lens, orders = doc_lens(per_gpu * world), itertools.count(1)
    staged = []

    def stage():
        cu, extra = None, {}
        if docs:
            order = pack_order(lens, 5, next(orders))
            cu = torch.tensor([0, *itertools.accumulate(order)], dtype=torch.int32)
            extra = dict(layout="whole_docs", cu_seqlens=cu)
        local = [mb.shard_seq(t, layout=extra.get("layout", "zigzag"), cu_seqlens=cu)
                 .detach().requires_grad_() for t in full]
        staged[:] = [local, extra]

    def run():
        local, extra = staged
        out = mb.burst_attn(*local, causal=True, **extra, **kw)
        out.backward(torch.ones_like(out))
    return stage, run


def host_ms(stage, run, device, repeat: int) -> float:
    """Median ms until ``run`` returned, each call staged first (untimed), the GPU idle."""
    stage()
    run()
    times = []
    for _ in range(repeat):
        stage()
        torch.cuda.synchronize(device)
        dist.barrier()
        t0 = time.perf_counter()
        run()
        times.append((time.perf_counter() - t0) * 1e3)
        torch.cuda.synchronize(device)
    return statistics.median(times)


def op_ms(stage, run, device, calls: int = 3) -> dict[str, float]:
    """Each host operator's own (self) CPU ms per call over ``calls`` calls under
    ``torch.profiler``, each staged first, the GPU idle at each start; only what runs
    inside the calls counts (``op_spans``: not the staging, nor the syncs)."""
    stage()
    run()

    def between() -> None:
        torch.cuda.synchronize(device)
        stage()
        torch.cuda.synchronize(device)
        dist.barrier()
    return profiled_calls(run, calls, between, self_time=True)


def growth(small: dict[str, float], large: dict[str, float], top: int = 12) -> list[dict]:
    """The operators whose own host ms per call grow most from ``small`` to ``large``."""
    names = sorted(set(small) | set(large),
                   key=lambda op: -(large.get(op, 0.0) - small.get(op, 0.0)))
    return [dict(op=op[:80], small_ms=round(small.get(op, 0.0), 4),
                 large_ms=round(large.get(op, 0.0), 4)) for op in names[:top]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--ops", action="store_true",
                        help="for document packs, the host operators whose own time grows "
                             "most from the tiny call to 8K (torch.profiler)")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    rank, world = start_ranks()
    device = torch.device("cuda", torch.cuda.current_device())
    sizes = {"tiny": (64, (world, world), 64), "8K": (8192, (32, 32), 128),
             "32K": (32768, (32, 32), 128)}
    rows = []
    for docs in (False, True):
        for kind, kw in KINDS.items():
            row = dict(kind=kind, mask="documents" if docs else "causal")
            ops = {}
            for size, (per_gpu, heads, d) in sizes.items():
                stage, run = _call(per_gpu, heads, d, world, docs, kw, device)
                row[f"{size}_host_ms"] = host_ms(stage, run, device, args.repeat)
                if args.ops and docs and size in ("tiny", "8K"):
                    ops[size] = op_ms(stage, run, device)
            if ops:
                row["ops_tiny_to_8K"] = growth(ops["tiny"], ops["8K"])
            rows.append(row)
            if rank == 0:
                print(row, flush=True)
    if rank == 0:
        emulate = os.environ.get(EMULATE_ENV) or None
        meta = dict(command=" ".join(["torchrun", f"--nproc_per_node={world}"] + sys.argv),
                    device=torch.cuda.get_device_name(0), torch=torch.__version__,
                    package=ran_package(), emulate=emulate,
                    date=time.strftime("%Y-%m-%d %H:%M:%S"))
        name = "host_kinds_emulated.json" if emulate else "host_kinds.json"
        with open(os.path.join(args.out, name), "w") as f:
            json.dump(dict(meta=meta, rows=rows), f, indent=1)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
