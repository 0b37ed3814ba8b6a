"""What the argument check costs a whole_docs call on a new pack (issue 41), rank by rank.

    MEGATRON_BURST_AGREE=first HQ=32 HKV=8 D=128 \
        torchrun --nproc_per_node=2 benchmarks/agree_phases.py
    DRY=1 HQ=4 HKV=2 D=16 torchrun --nproc_per_node=2 benchmarks/agree_phases.py   # CPU, gloo

Every call gets a new pack (documents of 1..4096 tokens, seeded), 8K tokens per GPU (1K on
CPU), causal, ring backward; the ranks are lined up (a sync and a barrier) before each of 30
timed calls. Each rank prints one JSON line of medians, in ms: ``lookup`` (the call's
preparation, ``prepare.lookup``), ``check`` (``agree.check_agreement``: the signature's
digest and its exchange), ``gather`` (``consensus.gather``, the exchange alone; where the
check is posted while the call is planned, ``post``, ``agree.begin``, and ``read``, the wait
for its result, ``consensus.Exchange.values``, in its place), the call's
host time and its wall time (to the GPU's end). Run with ``MEGATRON_BURST_AGREE=first``
(the default: every new pack is a new signature, checked) and ``off`` to see the check's
share, and with ``MEGATRON_BURST_HOST_CHANNEL=gloo`` (the default: the exchange over a gloo
twin of the group) and ``group`` (over the NCCL group itself) to see the channel's.
"""
from __future__ import annotations

import json
import os
import random
import statistics
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ranks import start_ranks  # noqa: E402

import megatron_burst as mb  # noqa: E402
from megatron_burst.attention import agree, prepare  # noqa: E402
from megatron_burst.comm import consensus  # noqa: E402

DRY = bool(os.environ.get("DRY"))
PHASES: dict[str, list[float]] = {name: [] for name in ("lookup", "check", "gather", "post",
                                                        "read")}


def timed(module, name: str, phase: str) -> None:
    """Wrap ``module.name`` so that each call's host ms lands in ``PHASES[phase]``."""
    inner = getattr(module, name)

    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            PHASES[phase].append((time.perf_counter() - start) * 1e3)

    setattr(module, name, wrapper)


def main() -> None:
    rank, world = start_ranks("gloo") if DRY else start_ranks()
    dev = torch.device("cpu") if DRY else torch.device("cuda", torch.cuda.current_device())
    sync = (lambda: None) if DRY else torch.cuda.synchronize
    hq, hkv, d = (int(os.environ.get(k, v)) for k, v in (("HQ", 32), ("HKV", 8), ("D", 128)))
    total = (1024 if DRY else 8192) * world
    dtype = torch.float32 if DRY else torch.bfloat16
    full = [torch.randn(1, total, h, d, device=dev, dtype=dtype) for h in (hq, hkv, hkv)]
    timed(prepare, "lookup", "lookup")
    timed(agree, "check_agreement", "check")
    timed(consensus, "gather", "gather")
    if hasattr(consensus, "Exchange"):  # the check posted while planning, read after
        timed(agree, "begin", "post")
        timed(consensus.Exchange, "values", "read")

    def call(seed: int) -> tuple[float, float]:
        rng, lens, left = random.Random(seed), [], total
        while left > 0:
            lens.append(min(left, rng.randint(1, 4096)))
            left -= lens[-1]
        cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
        local = [mb.shard_seq(t, layout="whole_docs", cu_seqlens=cu).detach().requires_grad_()
                 for t in full]
        grad = torch.randn_like(local[0])
        sync()
        dist.barrier()
        start = time.perf_counter()
        mb.burst_attn(*local, causal=True, layout="whole_docs", cu_seqlens=cu,
                      backward="ring").backward(grad)
        host = time.perf_counter()
        sync()
        return (host - start) * 1e3, (time.perf_counter() - start) * 1e3

    for seed in range(4):
        call(seed)
    for times in PHASES.values():
        times.clear()
    walls = [call(100 + seed) for seed in range(30)]
    result = {k: round(statistics.median(v), 3) for k, v in PHASES.items() if v}
    result.update(host_call=round(statistics.median(h for h, _ in walls), 3),
                  wall_call=round(statistics.median(w for _, w in walls), 3),
                  agree=os.environ.get("MEGATRON_BURST_AGREE", "first"),
                  channel=os.environ.get("MEGATRON_BURST_HOST_CHANNEL", "gloo"), rank=rank)
    print(json.dumps(result), flush=True)
    os._exit(0)  # no teardown wait: nothing of this run is needed after its line


if __name__ == "__main__":
    main()
