"""Where 'auto''s extra host time on new document packs goes (run with torchrun on 2 GPUs).

    torchrun --nproc_per_node=2 benchmarks/auto_gap.py --out OUT

``auto_check`` measured 'auto' 0.2-0.6 ms a call slower on the host than the topology it
chose, forced, on new packs (8K tokens a GPU, whole_docs; 2x H100, ``results/
h100x2_issue41_host``), where the Python each runs differs by a few dictionary lookups
(2 gloo ranks, ``sys.setprofile``). Three ways to the same topology, interleaved a call each
in rounds, a new pack every call (``auto_check``'s mix): ``auto``; ``forced`` (the options
that fix it); ``decided`` (``topology=`` the chosen CPTopology, no resolution). Per rank:
each way's median host ms (until the call returns) and wall ms (until the GPU is done), the
host ms inside ``prepare.lookup``, and the garbage collections that ran during each way's
calls; then a ``torch.profiler`` CPU trace of a few calls of each, and the CPU ops whose
total time differs most between ``auto`` and ``forced``. Rank 0 writes OUT/auto_gap.json.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from host_gap import inputs, pack_caller  # noqa: E402
from op_spans import profiled_calls  # noqa: E402
from ranks import ran_package, start_ranks  # noqa: E402

WAYS = ("auto", "forced", "decided")


class _Counters:
    """Host seconds inside ``prepare.lookup`` and garbage collections, per way."""

    def __init__(self):
        from megatron_burst.attention import prepare

        self.way, self.lookup_s, self.gcs = None, {}, {}
        inner = prepare.lookup

        def timed_lookup(*a, **kw):
            t0 = time.perf_counter()
            try:
                return inner(*a, **kw)
            finally:
                self.lookup_s.setdefault(self.way, []).append(time.perf_counter() - t0)
        prepare.lookup = timed_lookup
        gc.callbacks.append(self._gc)

    def _gc(self, phase, info):
        if phase == "start" and self.way is not None:
            self.gcs.setdefault(self.way, []).append(info["generation"])


def _trace(call, kw: dict, calls: int) -> dict[str, float]:
    """CPU op -> its total ms a call, over ``calls`` calls under the profiler (inside the
    calls' own spans: ``host_gap.pack_caller`` opens one around what it times)."""
    return profiled_calls(lambda: call(**kw), calls, spans_inside=True)


def run(world: int, device, rounds: int, per_gpu: int) -> dict:
    from megatron_burst.attention import prepare

    call = pack_caller(inputs(per_gpu, (32, 32), world, device), world, device, seed=23)
    kws = {"auto": dict(backward="auto", ulysses_size="auto", intra_node_size="auto")}
    for _ in range(3):
        call(**kws["auto"])
    chosen = [p for p in prepare.PREPARED.values() if p.decision is not None][-1].topology
    kws.update(forced=dict(backward=chosen.backward, ulysses_size=chosen.ulysses),
               decided=dict(topology=chosen))
    counters, times = _Counters(), {w: [] for w in WAYS}
    for way in WAYS:
        for _ in range(3):
            call(**kws[way])
    for _ in range(rounds):
        for way in WAYS:
            counters.way = way
            times[way].append(call(**kws[way]))
    counters.way = None
    traces = {w: _trace(call, kws[w], 5) for w in ("auto", "forced")}
    ops = sorted(set(traces["auto"]) | set(traces["forced"]),
                 key=lambda op: -abs(traces["auto"].get(op, 0) - traces["forced"].get(op, 0)))
    return dict(chosen=chosen.describe(), ways={w: dict(
        host_ms=statistics.median(h for h, _ in times[w]),
        wall_ms=statistics.median(t for _, t in times[w]),
        lookup_ms=statistics.median(counters.lookup_s.get(w, [0])) * 1e3,
        gc_collections=len(counters.gcs.get(w, [])),
        gc_gen2=sum(1 for g in counters.gcs.get(w, []) if g == 2)) for w in WAYS},
        cpu_ops_auto_minus_forced_ms=[dict(op=op[:80], auto=round(traces["auto"].get(op, 0), 4),
                                           forced=round(traces["forced"].get(op, 0), 4))
                                      for op in ops[:20]])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--per-gpu", type=int, default=8192)
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    os.environ.setdefault("MEGATRON_BURST_PROFILE_CACHE", os.path.join(args.out, "cache"))
    cuda = torch.cuda.is_available()
    rank, world = start_ranks() if cuda else start_ranks("gloo")
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    mine = run(world, device, args.rounds, args.per_gpu)
    ranks: list = [None] * world
    dist.all_gather_object(ranks, mine)
    if rank == 0:
        meta = dict(command=" ".join(["torchrun", f"--nproc_per_node={world}"] + sys.argv),
                    device=torch.cuda.get_device_name(0) if cuda else "cpu",
                    torch=torch.__version__,
                    package=ran_package(), date=time.strftime("%Y-%m-%d %H:%M:%S"))
        with open(os.path.join(args.out, "auto_gap.json"), "w") as f:
            json.dump(dict(meta=meta, ranks=ranks), f, indent=1)
        print(json.dumps(ranks, indent=1))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
