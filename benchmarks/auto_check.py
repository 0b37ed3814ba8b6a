"""Is `auto` right on this machine? Every forced topology and `auto`, timed in the same run.

    torchrun --nproc_per_node=2 benchmarks/auto_check.py --out OUT            # GPUs
    MEGATRON_BURST_EMULATE="gpus_per_node=1,gbps=25,latency_us=5" \
        torchrun --nproc_per_node=2 benchmarks/auto_check.py --out OUT        # emulated links
    torchrun --nproc_per_node=2 benchmarks/auto_check.py --smoke --out OUT    # CPU, gloo

For each cell (tokens per GPU x heads x mask: causal, or packed documents in the whole_docs
layout) it runs fwd+bwd of every topology the group allows, forced by hand (flat ring with
each backward, Ulysses splits, the double ring on 4+ GPUs), and of `auto` through the real
per-call path: its first use on this machine measures a profile (cached under
OUT/profile-cache unless --cache names another folder; a second run with the same cache
measures nothing) and its first call of each decision is checked against a timed call
(``attention.decision_check``). Each row prints its median time, the time model's prediction
from the profile `auto` decided with (the emulated links included), and their ratio; each
cell prints auto / best forced. Documents are predicted from the pack's own ring schedule
(``decide.scheduled_time.predict_pack``). Rank 0 writes
OUT/auto_check[_emulated].json with the command, device, settings, the first-use log and
every check.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ranks import EMULATE_ENV, emulated, ran_package, start_ranks  # noqa: E402

DOC_MIX = (0.40, 0.22, 0.15, 0.10, 0.06, 0.04, 0.02, 0.01)  # attention.py's "docs" pack


class _Log(logging.Handler):
    """The package's log lines about 'auto' (first use, checks), kept for the JSON."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record):
        self.lines.append(record.getMessage())


def _warm(method, warmup: int) -> None:
    """``warmup`` calls of ``method`` (auto's first use measures and checks in these)."""
    for _ in range(warmup):
        method.stage()
        method()


def _interleaved_ms(methods: dict, iters: int, device, trace: str | None = None
                    ) -> dict[str, dict]:
    """Each method's call (fwd+bwd) timed in rounds: one call of each method per round,
    each round starting one method later, its inputs staged before the clock starts, every
    rank starting each call together. Per method (rank 0's, as auto reads its timings):
    ``ms``, the median wall milliseconds until the GPU finished; ``host_ms``, the median
    until the call returned to Python (nothing in a call waits for the GPU, so this is the
    host's own work: a call whose host_ms nears its ms is host-bound); and every round's
    wall time. Interleaving puts every method under the same clock: a GPU's clock falls as
    a run heats it (5-12% on H100, ``sustained_rate.py``), which timing the methods one
    after another charged to the later ones. The rounds are a whole number of turns, so
    every method starts a round (runs a pack first) equally often. Each timed call follows
    an untimed one of its own method (``_Method.settle``), as in training, where one method
    runs call after call: the rotation kept each method behind the same other, and auto,
    always behind Ulysses, ran its topology 3-5% slower than the same topology forced (8K
    packs, per round, 2x H100), where with no Ulysses row between them 1.5%
    (``auto_gap.py``); the gap stayed with the untimed call (``results/
    h100x2_issue41_settled``), so the order is not its cause. A method of several
    ``layers`` runs that many attention calls a round; its times are per attention call."""
    times: dict[str, list[float]] = {name: [] for name in methods}
    host: dict[str, list[float]] = {name: [] for name in methods}
    names = list(methods)
    rounds = -(-iters // len(names)) * len(names)
    with _traced(trace, device):
        _rounds(methods, names, rounds, device, times, host)
    box = [{name: dict(ms=statistics.median(t), host_ms=statistics.median(host[name]),
                       rounds_ms=[round(x, 3) for x in t]) for name, t in times.items()}]
    dist.broadcast_object_list(box, src=0)
    return box[0]


@contextlib.contextmanager
def _traced(path: str | None, device):
    """Under ``torch.profiler`` (the host's ops, and the GPU's where there is one), its trace
    written to ``path`` (Chrome's format); nothing where ``path`` is None."""
    if path is None:
        yield
        return
    from torch.profiler import ProfilerActivity, profile

    kinds = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=kinds) as prof:
        yield
    prof.export_chrome_trace(path)


def _rounds(methods: dict, names: list, rounds: int, device, times: dict, host: dict) -> None:
    """``rounds`` rounds of ``_interleaved_ms``, each call labelled ``method:NAME`` in a
    trace."""
    for i in range(rounds):
        # Each round starts at the next method: none always follows the same one (in the
        # run of commit 6eb3af6, auto, always first after the Ulysses row, ran its topology
        # 7-11% slower than the same topology forced at 8K/GPU with documents).
        for name in names[i % len(names):] + names[:i % len(names)]:
            method = methods[name]
            method.settle()
            method.stage()
            if device.type == "cuda":
                torch.cuda.synchronize()
            dist.barrier()
            t0 = time.perf_counter()
            with torch.profiler.record_function(f"method:{name}"):
                method()
            host[name].append((time.perf_counter() - t0) * 1e3 / method.layers)
            if device.type == "cuda":
                torch.cuda.synchronize()
            times[name].append((time.perf_counter() - t0) * 1e3 / method.layers)


def _forced(world: int, hq: int, hkv: int, docs: bool) -> dict[str, dict]:
    """Every topology forced by hand: its name -> burst_attn keywords."""
    from megatron_burst.decide.topology import HeadShape, heads_split

    rows = {f"flat ring {world}, {b} bwd": dict(ulysses_size=1, backward=b)
            for b in ("burst", "ring")}
    if world >= 4:
        for b in ("burst", "ring"):
            rows[f"double ring 2x{world // 2}, {b} bwd"] = dict(
                ulysses_size=1, intra_node_size=world // 2, backward=b)
    for u in (2, 4, 8):
        if world % u == 0 and u <= world and heads_split(HeadShape(hq, hkv, 128), u):
            ring = world // u
            for b in (("burst", "ring") if ring > 1 else ("ring",)):
                rows[f"ulysses {u} x ring {ring}" + (f", {b} bwd" if ring > 1 else "")] = dict(
                    ulysses_size=u, backward=b)
    return rows


class _Cell:
    """A cell's inputs: the whole sequence's q, k, v and dO, drawn once, and for document
    cells packs of the same lengths in other orders. Training feeds a new pack every
    micro-batch: each method's c-th call gets the c-th order (the same for every method, so
    they time the same packs), and nothing planned for it before (``stage`` empties the plan
    cache: two methods of one topology would otherwise share the plan of a pack, as one
    micro-batch's layers do, and the second would look faster). A pack's placement, so its
    balance, moves with the order."""

    def __init__(self, per_gpu, hq, hkv, d, docs, world, device, dtype):
        total = per_gpu * world
        gen = torch.Generator(device="cpu").manual_seed(per_gpu + hq + hkv)
        self.full = [torch.randn(1, total, h, d, generator=gen).to(device, dtype)
                     for h in (hq, hkv, hkv)]
        self.do = torch.randn(1, per_gpu, hq, d, generator=gen).to(device, dtype)
        self.lens = doc_lens(total) if docs else None
        self.seed = total + hq + hkv
        self.ran: set = set()  # the orders called

    def order(self, c: int) -> tuple[int, ...] | None:
        """The lengths of the c-th call's pack (None: a plain sequence)."""
        return None if self.lens is None else pack_order(self.lens, self.seed, c)


    def inputs(self, c: int) -> tuple[list, torch.Tensor, dict]:
        """(q, k, v shards needing grad, dO, burst_attn keywords) of the c-th call."""
        import megatron_burst as mb
        from megatron_burst.attention import call_plan

        kw, cu, lens = dict(causal=True), None, self.order(c)
        if lens is not None:
            call_plan.clear()  # nothing planned for this pack (see the class docstring)
            self.ran.add(lens)
            cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
            kw.update(layout="whole_docs", cu_seqlens=cu)
        local = [mb.shard_seq(t, layout=kw.get("layout", "zigzag"), cu_seqlens=cu)
                 .detach().requires_grad_() for t in self.full]
        return local, self.do.view(local[0].shape), kw


def doc_lens(total: int) -> list[int]:
    """A documents cell's lengths (``DOC_MIX`` of ``total`` tokens), in their first order."""
    lens = [int(total * f) for f in DOC_MIX]
    lens[0] += total - sum(lens)
    return lens


def pack_order(lens: list[int], seed: int, c: int) -> tuple[int, ...]:
    """The c-th call's order of ``lens``: the first as given, then shuffled by ``seed``."""
    import random

    return tuple(lens if c == 0 else random.Random(seed * 1000 + c).sample(lens, len(lens)))


def predicted_ms(top, prof, per_gpu: int, loads: list, max_intra_node_size: int,
                 host_ms: float | None = None) -> float:
    """A row's model time: a plain causal call's (``loads`` [None]), or the median over the
    packs a documents cell ran (``predict_pack`` of each one's load). ``host_ms``: the
    row's own measured host time in place of the model's (``model_replay.py --row-host``:
    what the model would give with its host term exact)."""
    from megatron_burst.decide.scheduled_time import predict_pack
    from megatron_burst.decide.timing import overlapped, predict

    def total(p) -> float:
        if host_ms is None:
            return p.total_s
        return overlapped(p.compute_s + p.exposed_comm_s + p.alltoall_s, host_ms * 1e-3)

    return statistics.median(
        total(predict(top, prof, tokens=per_gpu, causal=True,
                      max_intra_node_size=max_intra_node_size) if load is None else
              predict_pack(top, prof, load, max_intra_node_size=max_intra_node_size)) * 1e3
        for load in loads)


class _Method:
    """One row's calls: ``stage()`` takes its next call's inputs (untimed), a call runs them:
    ``layers`` attention calls on them, all forwards then all backwards, as a model's layers
    share a micro-batch's pack (its plan made at the first, found by the others)."""

    def __init__(self, cell: _Cell, opts: dict, outs: dict, name: str, layers: int = 1):
        self.cell, self.opts, self.outs, self.name = cell, opts, outs, name
        self.calls, self._staged, self.layers = 0, None, layers

    def stage(self, c: int | None = None) -> None:
        """Its next call's inputs, or (``c``) the c-th order's, outside its own count."""
        if c is None:
            c, self.calls = self.calls, self.calls + 1
        self._staged = self.cell.inputs(c)

    def settle(self) -> None:
        """One untimed call on its last pack again (the first's before any call): what ran
        before its timed call is then this method, as in training."""
        self.stage(max(self.calls - 1, 0))
        self()

    def __call__(self) -> None:
        import megatron_burst as mb

        local, do, kw = self._staged
        outs = [mb.burst_attn(*local, **kw, **self.opts) for _ in range(self.layers)]
        torch.autograd.backward(outs, [do] * len(outs))
        self.outs[self.name] = outs[-1].detach()


def run_cell(args, per_gpu, hq, hkv, docs, world, device, dtype) -> list[dict]:
    """One cell: auto warmed first (its first use measures and checks), then every forced
    topology warmed; then all of them timed in interleaved rounds (``_interleaved_ms``);
    every row with the model's prediction from the profile auto decided with."""
    import megatron_burst as mb
    from megatron_burst.attention import decision_check, prepare
    from megatron_burst.decide.topology import CPTopology

    from megatron_burst.decide.pack_load import PackLoad

    cell = _Cell(per_gpu, hq, hkv, args.head_dim, docs, world, device, dtype)
    outs = {}
    # Every call prepared from here on is this cell's: auto's decision is found among them.
    # (Told apart by id() before, an id freed with an earlier call came back, so one rank
    # found no decision, left the cell, and its peer waited forever in the next one.)
    prepare.PREPARED.clear()
    checks = set(decision_check.CHECKS)
    auto = dict(ulysses_size="auto", intra_node_size="auto", backward="auto")
    fns = {"auto": _Method(cell, auto, outs, "auto", args.layers)}
    _warm(fns["auto"], args.warmup)  # first: its first use measures, its first calls check
    first = cell.order(0)
    rows = [dict(method="auto")]
    mine = [p for p in prepare.PREPARED.values()
            if p.decision is not None and p.decision.ranked]
    found = torch.tensor([float(bool(mine))], device=device)
    dist.all_reduce(found, op=dist.ReduceOp.MIN)  # every rank leaves the cell, or none
    if not found.item():
        rows[0]["error"] = "no decision of auto found"
        return _label(rows, per_gpu, hq, hkv, docs, world)
    prepared, decision = mine[-1], mine[-1].decision
    tops = {"auto": prepared.topology}
    rows[0].update(topology=prepared.topology.describe(),
                   model_first_choice=decision.topology.describe(),
                   profile=f"{decision.profile.name} "
                           f"({decision.profile.measured or 'date not recorded'})",
                   checks=[_check_json(decision_check.CHECKS[k]) for k in decision_check.CHECKS
                           if k not in checks])
    for name, opts in _forced(world, hq, hkv, docs).items():
        fns[name] = _Method(cell, opts, outs, name, args.layers)
        try:
            _warm(fns[name], args.warmup)
        except Exception as e:  # a topology this cell cannot run is reported, not fatal
            rows.append(dict(method=name, error=f"{type(e).__name__}: {str(e)[:160]}"))
            del fns[name]
            continue
        rows.append(dict(method=name))
        tops[name] = CPTopology.build(world, ulysses=opts["ulysses_size"],
                                      intra_node_size=opts.get("intra_node_size"),
                                      backward=opts["backward"], heads=decision.key[1])
        rows[-1]["topology"] = tops[name].describe()
    ms = _interleaved_ms(fns, args.iters, device)
    if docs and per_gpu in args.trace:  # one more turn, untimed, under the profiler
        os.makedirs(os.path.join(args.out, "trace"), exist_ok=True)
        _interleaved_ms(fns, len(fns), device, trace=os.path.join(
            args.out, "trace", f"{per_gpu}_{hq}-{hkv}_documents_rank{dist.get_rank()}.json"))
    # Exactness: every method once more on one shared pack (untimed), against auto's output.
    for name, method in fns.items():
        method.stage(10**6)
        method()
        if name != "auto":
            row = next(r for r in rows if r["method"] == name)
            row["rel_err_vs_auto"] = float((outs[name].float() - outs["auto"].float()).norm()
                                           / outs["auto"].float().norm())
    for r in rows:
        if r["method"] in ms:
            r.update(ms[r["method"]])
    # Every order of the cell's lengths has its own placement: the row's prediction is the
    # median over the orders the cell ran (``predict_pack`` of each one's load).
    loads = ([PackLoad.of_pack(order, "whole_docs") for order in sorted(cell.ran)]
             if cell.lens is not None else [None])
    for r in rows:  # the model's time for every row, from auto's own profile
        if r["method"] in tops:
            pred = predicted_ms(tops[r["method"]], decision.profile, per_gpu, loads,
                                decision.key[3])
            r.update(predicted_ms=pred, measured_over_predicted=r["ms"] / pred)
    if first is not None:
        rows[0]["packs"] = dict(first=list(first), orders_run=len(cell.ran))
    return _label(rows, per_gpu, hq, hkv, docs, world)


def _check_json(check) -> dict:
    return dict(chosen=check.chosen.describe(), predicted_ms=check.predicted_s * 1e3,
                measured_ms=check.measured_s * 1e3, kept=check.kept.describe(),
                runner_up=check.runner_up.describe() if check.runner_up else None,
                runner_up_ms=None if check.runner_up_s is None else check.runner_up_s * 1e3,
                chosen_again_ms=None if check.chosen_again_s is None
                else check.chosen_again_s * 1e3,
                sibling=None if check.sibling is None else check.sibling[0].describe(),
                sibling_ms=None if check.sibling is None else check.sibling[1] * 1e3)


def _label(rows, per_gpu, hq, hkv, docs, world) -> list[dict]:
    for r in rows:
        r.update(per_gpu=per_gpu, heads=f"{hq}:{hkv}", mask="documents" if docs else "causal",
                 world=world, model_note="documents: the pack's own schedule (predict_pack)"
                 if docs else "")
    return rows


def _summary(rows: list[dict]) -> str:
    auto = rows[0]
    forced = [r for r in rows[1:] if "ms" in r]
    best = min(forced, key=lambda r: r["ms"]) if forced else None
    head = (f"# {auto['per_gpu']}/GPU {auto['heads']} {auto['mask']} on {auto['world']}: auto "
            f"{auto.get('topology')} ({auto.get('profile', '?')})")
    if best:
        auto["auto_over_best"] = auto["ms"] / best["ms"]
        head += f"; auto/best = {auto['auto_over_best']:.2f} (best: {best['method']})"
    same = next((r for r in forced if r.get("topology") == auto.get("topology")), None)
    if same:  # auto's own cost beside its choice's: per round, the same pack for both
        auto["auto_over_same_paired"] = statistics.median(
            a / b for a, b in zip(auto["rounds_ms"], same["rounds_ms"]))
        head += f"; auto/its topology forced = {auto['auto_over_same_paired']:.3f} per round"
    lines = [head]
    for r in rows:
        if "error" in r:
            lines.append(f"    {r['method']:<32} error: {r['error']}")
            continue
        pred = r.get("predicted_ms")
        lines.append(f"    {r['method']:<32} {r['ms']:9.2f} ms (host {r['host_ms']:7.2f})   model "
                     f"{pred or float('nan'):9.2f} ms   measured/model "
                     f"{r.get('measured_over_predicted', float('nan')):.2f}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="folder for the JSON (and the cache)")
    parser.add_argument("--per-gpu", default="8192,32768")
    parser.add_argument("--heads", default="32:32,32:8")
    parser.add_argument("--masks", default="causal,documents")
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--iters", type=int, default=15,
                        help="timed rounds (rounded up to whole turns of the methods)")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--cache", default=None,
                        help="the profile cache (default OUT/profile-cache)")
    parser.add_argument("--layers", type=int, default=1,
                        help="attention calls per pack, as a model's layers share a "
                             "micro-batch's pack; a row's times are per call (default 1: a "
                             "new pack every call, what the time model prices)")
    parser.add_argument("--trace", default="",
                        help="tokens/GPU (comma-separated) whose documents cells run one more "
                             "turn of rounds under torch.profiler, each rank's trace in "
                             "OUT/trace/ (auto's own cost beside its topology forced)")
    parser.add_argument("--smoke", action="store_true",
                        help="CPU gloo ranks, toy sizes (checks the script, times nothing real)")
    args = parser.parse_args()
    args.trace = {int(x) for x in args.trace.split(",") if x}
    if args.layers < 1:
        raise ValueError(f"--layers must be at least 1, got {args.layers}")
    if args.smoke:
        args.per_gpu, args.heads, args.head_dim, args.iters, args.warmup = (
            "128,256", "4:4,4:2", 16, 2, 1)
    os.makedirs(args.out, exist_ok=True)
    os.environ["MEGATRON_BURST_PROFILE_CACHE"] = args.cache or os.path.join(args.out,
                                                                          "profile-cache")
    os.environ.setdefault("MEGATRON_BURST_AUTO_MEASURE", "on")
    log = _Log()
    logging.getLogger("megatron_burst").addHandler(log)
    logging.getLogger("megatron_burst").setLevel(logging.INFO)
    rank, world = start_ranks("gloo") if args.smoke else start_ranks()
    device = (torch.device("cpu") if args.smoke
              else torch.device("cuda", torch.cuda.current_device()))
    dtype = torch.float32 if args.smoke else torch.bfloat16
    rows, t_start = [], time.time()
    for per_gpu in (int(x) for x in args.per_gpu.split(",")):
        for hq, hkv in (tuple(map(int, h.split(":"))) for h in args.heads.split(",")):
            for mask in args.masks.split(","):
                cell = run_cell(args, per_gpu, hq, hkv, mask == "documents", world, device,
                                dtype)
                rows += cell
                if rank == 0:
                    print(_summary(cell), flush=True)
                if device.type == "cuda":
                    torch.cuda.empty_cache()
    if rank == 0:
        _write(args, rows, log.lines, world, device, time.time() - t_start)
    dist.barrier()  # no rank leaves while rank 0 still writes
    dist.destroy_process_group()


def _write(args, rows, lines, world, device, seconds) -> None:
    ratios = [r["auto_over_best"] for r in rows if "auto_over_best" in r]
    own = [r["auto_over_same_paired"] for r in rows if "auto_over_same_paired" in r]
    errors = [abs(r["measured_over_predicted"] - 1) for r in rows
              if "measured_over_predicted" in r]
    meta = dict(command=" ".join(["torchrun", f"--nproc_per_node={world}"] + sys.argv),
                device=torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu",
                gpus=world, torch=torch.__version__, package=ran_package(),
                nccl=str(torch.cuda.nccl.version()) if device.type == "cuda" else None,
                date=time.strftime("%Y-%m-%d %H:%M:%S"), seconds=round(seconds, 1),
                emulated=emulated(), layers=args.layers,
                env={k: v for k, v in os.environ.items() if k.startswith("MEGATRON_BURST")},
                auto_log=lines, worst_auto_over_best=max(ratios, default=None),
                worst_auto_over_same_paired=max(own, default=None),
                rows_model_within_15pct=f"{sum(e <= 0.15 for e in errors)} of {len(errors)}")
    name = "auto_check_emulated.json" if os.environ.get(EMULATE_ENV) else "auto_check.json"
    path = os.path.join(args.out, name)
    with open(path, "w") as f:
        json.dump(dict(meta=meta, rows=rows), f, indent=1)
    print(f"wrote {path} ({seconds:.0f} s); worst auto/best "
          f"{meta['worst_auto_over_best']}; model within 15% in "
          f"{meta['rows_model_within_15pct']} rows", flush=True)
    for line in lines:
        if "measured this machine" in line or "matches this machine" in line:
            print("  " + line, flush=True)


if __name__ == "__main__":
    main()
