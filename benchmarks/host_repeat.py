"""How steady is first use's host measurement? (run with torchrun on 2 GPUs)

    torchrun --nproc_per_node=2 benchmarks/host_repeat.py --out OUT [--reps 4]

The time model's host figures come from tiny calls timed at first use
(``first_use.host_fields``). On 2x H100 two first uses 2.5 minutes apart read a new pack's
ring host as 4.51 and 5.46 ms, and an earlier session's 6.56, where the same rows took
5.5-5.8 ms each time (``results/h100x2_issue41_settled``, ``h100x2_issue41_real_packs/
trace_ff72cd2``). This
takes ``--reps`` measurements in one process, each followed by the truth it stands for: the
median host milliseconds of 8 fwd+bwd calls on new packs of ``auto_check``'s document mix at
8K tokens a GPU (32:8 heads, d 128, bf16), flat ring and Ulysses, and of 8 plain causal
calls. First use times calls of the call's own shape (``measure.HostShape.of_call``);
``--tiny``: tiny calls, as it did before. Each line: the figure, then (in brackets) the
truth it stands for; a pack's figure is the model's for the truth's 8 documents. Every raw sample is kept, so estimators
other than the median can be tried on the same numbers. Rank 0 writes OUT/host_repeat.json
and prints a line a measurement. Without CUDA it runs on gloo ranks (use a small
``--per-gpu``).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from auto_check import doc_lens  # noqa: E402
from host_gap import inputs, pack_caller  # noqa: E402
from ranks import ran_package, start_ranks  # noqa: E402

KINDS = {"ring": dict(ulysses_size=1, backward="ring"),
         "ulysses": dict(ulysses_size=2, backward="ring")}
CALLS = 8


def recorded_fields(device, world: int, shape) -> tuple[dict, list[list[float]]]:
    """One ``host_fields`` measurement, with every list of samples it read, in order (ring,
    Ulysses, then the packs: the ring's of ``first_use.PACK_DOCS`` documents, Ulysses')."""
    import megatron_burst as mb
    from megatron_burst.attention import first_use, measure

    seen: list[list[float]] = []
    original = measure.host_rounds

    def keep(*args, **kw):
        out = original(*args, **kw)
        seen.extend([round(s * 1e3, 4) for s in one] for one in out)
        return out
    measure.host_rounds = keep
    try:
        fields = first_use.host_fields(None, world, device, torch.bfloat16, 3, mb.burst_attn,
                                       shape)
    finally:
        measure.host_rounds = original
    return fields, seen


def truths(full, world: int, device, seed: int) -> dict:
    """Median host ms of ``CALLS`` new-pack calls of each kind, and of plain causal calls."""
    import megatron_burst as mb
    from megatron_burst.attention import measure

    out = {}
    for name, kw in KINDS.items():
        call = pack_caller(full, world, device, seed=seed)
        call(**kw)  # its first pack: warm
        out[f"{name}_pack_ms"] = statistics.median(call(**kw)[0] for _ in range(CALLS))
    q, k, v = (mb.shard_seq(t).detach().requires_grad_() for t in full)
    for name, kw in KINDS.items():
        hosts = []
        for _ in range(CALLS + 1):
            measure.sync(device)
            dist.barrier()
            t0 = time.perf_counter()
            mb.burst_attn(q, k, v, causal=True, **kw).sum().backward()
            hosts.append((time.perf_counter() - t0) * 1e3)
        out[f"{name}_causal_ms"] = statistics.median(hosts[1:])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--reps", type=int, default=4)
    parser.add_argument("--per-gpu", type=int, default=8192)
    parser.add_argument("--tiny", action="store_true",
                        help="time tiny calls, as first use did before it took the call's shape")
    args = parser.parse_args()
    if args.reps < 1:
        raise SystemExit(f"host_repeat: --reps must be >= 1, got {args.reps}")
    gpu = torch.cuda.is_available()
    rank, world = start_ranks() if gpu else start_ranks("gloo")
    device = torch.device("cuda", torch.cuda.current_device()) if gpu else torch.device("cpu")
    full = inputs(args.per_gpu, (32, 8), world, device)
    from megatron_burst.attention.measure import HostShape
    # what first use times for a call of the truth's shape (a rank's q of 32 heads)
    shape = HostShape.of_call(full[0][:, :args.per_gpu], world)
    rows = []
    for rep in range(args.reps):
        t0 = time.perf_counter()
        tiny = HostShape.tiny(world, device)
        fields, raw = recorded_fields(device, world, tiny if args.tiny else shape)
        took = time.perf_counter() - t0
        rows.append(dict(rep=rep, seconds=round(took, 2), fields=fields, raw_ms=raw,
                         truth=truths(full, world, device, seed=rep + 1)))
        if rank == 0:
            f, t = fields, rows[-1]["truth"]
            docs = len(doc_lens(16))  # the truth's packs: auto_check's mix
            pack = (f["pack_call_overhead_us"] + docs * f["pack_doc_overhead_us"]) / 1e3
            ulysses_pack = (f["ulysses_pack_call_overhead_us"]
                            + docs * f["ulysses_pack_doc_overhead_us"]) / 1e3
            print(f"rep {rep}: call {f['call_overhead_us'] / 1e3:.2f} (causal ring "
                  f"{t['ring_causal_ms']:.2f})  ulysses {f['ulysses_call_overhead_us'] / 1e3:.2f}"
                  f" ({t['ulysses_causal_ms']:.2f})  pack of {docs} {pack:.2f}"
                  f" ({t['ring_pack_ms']:.2f})  ulysses pack {ulysses_pack:.2f}"
                  f" ({t['ulysses_pack_ms']:.2f})"
                  f"  [{took:.1f} s]", flush=True)
    if rank == 0:
        os.makedirs(args.out, exist_ok=True)
        name = torch.cuda.get_device_name(device) if gpu else "cpu"
        meta = dict(command="torchrun --nproc_per_node=2 benchmarks/host_repeat.py "
                    + " ".join(sys.argv[1:]), device=name, host_shape=None if args.tiny
                    else dataclasses.asdict(shape),
                    world=world, package=ran_package(), calls=CALLS)
        path = os.path.join(args.out, "host_repeat.json")
        with open(path, "w") as fh:
            json.dump(dict(meta=meta, rows=rows), fh, indent=1)
        print(f"wrote {path}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
