"""What a torch.profiler Chrome trace says about a step: where the host waited for the GPU,
and where the GPU waited for the host.

    python benchmarks/trace_summary.py TRACE.json [--out SUMMARY.json]

Reads a trace written by ``MEGATRON_BURST_TRACE`` (``megatron_burst.megatron.trace``) or any
``export_chrome_trace`` and prints:

- the span, the GPU's busy time (the union of its kernels and copies) and its idle time;
- every host sync (``cudaStreamSynchronize``, ``cudaDeviceSynchronize``,
  ``cudaEventSynchronize``, a blocking ``cudaMemcpy``), each with the time it waited and the
  chain of host ops and annotations around it (by containment on its thread), grouped by
  that chain: a sync a micro-batch is a host stall the GPU's queue drains in;
- the GPU's idle gaps longer than ``--gap-us``, each with the host op running on the launching
  thread when it started (what the GPU was waiting for).

Why: a step whose host waits for the GPU cannot run ahead, so the host's own time adds to
the step's; the syncs say where, without a profiler's per-op overhead mattering.
"""
from __future__ import annotations

import argparse
import collections
import json

SYNCS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize",
         "cudaMemcpy", "cudaStreamWaitEvent_blocking")
GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
HOST_CATS = ("cpu_op", "user_annotation", "python_function")


def load(path: str) -> list[dict]:
    with open(path) as f:
        events = json.load(f)["traceEvents"]
    return [e for e in events if e.get("ph") == "X" and "dur" in e]


def busy_union(intervals: list[tuple[float, float]]) -> tuple[float, list[tuple[float, float]]]:
    """(the union's length, the gaps between its pieces)."""
    total, gaps, end = 0.0, [], None
    for start, stop in sorted(intervals):
        if end is None or start > end:
            if end is not None:
                gaps.append((end, start))
            total += stop - start
            end = stop
        elif stop > end:
            total += stop - end
            end = stop
    return total, gaps


def enclosing(host: list[dict], queries: list[dict]) -> list[list[str]]:
    """For each query event, the names of the host events on its thread that contain it,
    outermost first: one sweep a thread, a stack of the events still open."""
    chains: list[list[str]] = [[] for _ in queries]
    threads = collections.defaultdict(list)
    for e in host:
        threads[e["tid"]].append(e)
    order = sorted(range(len(queries)), key=lambda i: queries[i]["ts"])
    by_thread = collections.defaultdict(list)
    for i in order:
        by_thread[queries[i]["tid"]].append(i)
    for tid, asked in by_thread.items():
        mine = sorted(threads.get(tid, []), key=lambda e: (e["ts"], -e["dur"]))
        stack: list[dict] = []
        at = 0
        for i in asked:
            q = queries[i]
            while at < len(mine) and mine[at]["ts"] <= q["ts"]:
                e = mine[at]
                while stack and stack[-1]["ts"] + stack[-1]["dur"] < e["ts"]:
                    stack.pop()
                stack.append(e)
                at += 1
            chains[i] = [e["name"] for e in stack if e is not q
                         and e["ts"] + e["dur"] >= q["ts"] + q["dur"]]
    return chains


def summarise(events: list[dict], gap_us: float) -> dict:
    gpu = [e for e in events if e.get("cat") in GPU_CATS]
    host = sorted((e for e in events if e.get("cat") in HOST_CATS), key=lambda e: e["ts"])
    runtime = [e for e in events if e.get("cat") == "cuda_runtime"]
    t0 = min(e["ts"] for e in events)
    t1 = max(e["ts"] + e["dur"] for e in events)
    busy, gaps = busy_union([(e["ts"], e["ts"] + e["dur"]) for e in gpu])
    waits = [e for e in runtime if e["name"] in SYNCS]
    main_tid = collections.Counter(e["tid"] for e in runtime).most_common(1)[0][0] \
        if runtime else None
    wide = [(start, stop) for start, stop in gaps if stop - start >= gap_us]
    probes = [{"tid": main_tid, "ts": start, "dur": 0} for start, _ in wide]
    chains = enclosing(host, waits + probes)
    syncs = collections.defaultdict(lambda: [0, 0.0])
    for e, chain in zip(waits, chains):
        where = " > ".join(chain)[-300:]
        syncs[(e["name"], where)][0] += 1
        syncs[(e["name"], where)][1] += e["dur"]
    long_gaps = [dict(us=round(stop - start, 1), host=" > ".join(chain)[-300:])
                 for (start, stop), chain in zip(wide, chains[len(waits):])]
    return dict(span_ms=round((t1 - t0) / 1e3, 3), gpu_busy_ms=round(busy / 1e3, 3),
                gpu_idle_ms=round((t1 - t0 - busy) / 1e3, 3),
                syncs=sorted(([name, chain, n, round(us, 1)] for (name, chain), (n, us)
                              in syncs.items()), key=lambda r: -r[3]),
                idle_gaps_over=gap_us, idle_gaps=sorted(long_gaps, key=lambda g: -g["us"])[:40],
                idle_in_long_gaps_ms=round(sum(g["us"] for g in long_gaps) / 1e3, 3))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace")
    parser.add_argument("--gap-us", type=float, default=50.0)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    s = summarise(load(args.trace), args.gap_us)
    print(f"{args.trace}: span {s['span_ms']} ms, GPU busy {s['gpu_busy_ms']} ms, idle "
          f"{s['gpu_idle_ms']} ms ({s['idle_in_long_gaps_ms']} ms in gaps over {args.gap_us} us)")
    print("host syncs (call, count, us waited, where):")
    for name, chain, n, us in s["syncs"]:
        print(f"  {name} x{n} {us:.0f} us: {chain}")
    print("longest GPU idle gaps (us: the host op then):")
    for g in s["idle_gaps"][:15]:
        print(f"  {g['us']:.0f}: {g['host']}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(s, f, indent=1)


if __name__ == "__main__":
    main()
