"""What one agreement's exchange costs the host: over the NCCL group or over its gloo twin.

    torchrun --nproc_per_node=2 benchmarks/host_exchange.py --out OUT.json
    DRY=1 torchrun --nproc_per_node=2 benchmarks/host_exchange.py --out OUT.json  # CPU, gloo

Every agreement of the package (``comm.consensus.gather``: a call's signature, a mode, an
error) is a few int64s each host must read. Over NCCL (``MEGATRON_BURST_HOST_CHANNEL=group``)
they are uploaded, all-gathered behind the GPU's queue and read back; over the group's gloo
twin (``gloo``, the default; ``comm.host_channel``) the GPU is not involved. Both ways are
timed in one process, alternated call by call (so the host's drift shows in both alike), the
ranks lined up by a barrier before each: with the GPU idle, and with about ``--busy-ms`` of
work queued on it first (as when the host runs ahead of the GPU in training). Rank 0 prints
a table of medians and writes the JSON. On CPU (DRY) both ways are gloo.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ranks import ran_package, start_ranks  # noqa: E402

from megatron_burst.comm import consensus  # noqa: E402

DRY = bool(os.environ.get("DRY"))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--calls", type=int, default=200)
    p.add_argument("--busy-ms", type=float, default=2.0)
    p.add_argument("--out", required=True)
    a = p.parse_args()
    rank, world = start_ranks("gloo") if DRY else start_ranks()
    ways = {"gloo twin": lambda v: consensus.gather(None, v, "for a benchmark"),
            "NCCL group": lambda v: consensus.Exchange(None, v, "for a benchmark",
                                                       on_group=True).values()}
    spin = (lambda: None) if DRY else _spinner(a.busy_ms)
    times: dict[str, list[float]] = {f"{w}, {g}": [] for w in ways for g in ("idle", "busy")}
    for i in range(a.calls + 10):
        for gpu in ("idle", "busy"):
            for way, gather in ways.items():
                if not DRY:
                    torch.cuda.synchronize()
                dist.barrier()
                if gpu == "busy":
                    spin()
                start = time.perf_counter()
                table = gather([rank, i])
                took = (time.perf_counter() - start) * 1e3
                assert table == [[r, i] for r in range(world)], table
                if i >= 10:
                    times[f"{way}, {gpu}"].append(took)
    rows = [{"case": k, "host_ms_median": round(statistics.median(v), 4),
             "host_ms_p90": round(sorted(v)[int(0.9 * len(v))], 4)} for k, v in times.items()]
    if rank == 0:
        device = "cpu" if DRY else f"{torch.cuda.get_device_name()} x{world}"
        meta = {"device": device, "torch": torch.__version__,
                "package": ran_package(), "calls": a.calls,
                "busy_ms": a.busy_ms, "command": "torchrun --nproc_per_node=%d %s" % (
                    world, " ".join(["benchmarks/host_exchange.py", *sys.argv[1:]]))}
        print("| exchange, GPU | host ms (median) | p90 |\n|---|---|---|")
        for r in rows:
            print(f"| {r['case']} | {r['host_ms_median']:.3f} | {r['host_ms_p90']:.3f} |")
        with open(a.out, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)
    os._exit(0)  # no teardown wait


def _spinner(busy_ms: float):
    """A function that queues about ``busy_ms`` of GPU work (``torch.cuda._sleep``)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(10**7)
    end.record()
    end.synchronize()
    cycles = int(10**7 * busy_ms / start.elapsed_time(end))
    return lambda: torch.cuda._sleep(cycles)


if __name__ == "__main__":
    main()
