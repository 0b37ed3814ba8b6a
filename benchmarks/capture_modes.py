"""Which ring calls a CUDA graph captures on every rank, in each capture error mode (torchrun).

    torchrun --nproc_per_node=4 benchmarks/capture_modes.py --out OUT.json

Why: on 4 H100s ``tests/test_gpu.py::test_graph_replay_matches_eager_over_nccl`` failed on one
rank with ``cudaErrorStreamCaptureInvalidated`` while capturing a ring backward (2 GPUs had
always passed). Something invalidated the capture before the op that reported it. A capture
in the "global" mode (``make_graphed_callables``', and Megatron's) is invalidated by an unsafe
CUDA call from *any* thread, such as NCCL's watchdog querying an event of work enqueued
before the capture (pytorch/pytorch#104487); in the "thread_local" mode only by this thread's.
So each case (the test's four: causal with either backward, full MHA, a window) is warmed up
eagerly, then its forward and backward are captured in one graph, ``--rounds`` times in each
mode, on fresh graphs, and replayed against the eager call. Rank 0 writes, per case and mode,
how many captures failed on each rank and the replay's largest relative error.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import traceback

import torch
import torch.distributed as dist

import megatron_burst as mb

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ranks import ran_package, start_ranks  # noqa: E402

CASES = {"causal burst bwd": (dict(causal=True, backward="burst"), (16, 4, 4)),
         "causal ring bwd": (dict(causal=True, backward="ring"), (16, 4, 4)),
         "full MHA": (dict(causal=False), (8, 8, 8)),
         "window": (dict(causal=True, window_size=(700, 0)), (16, 4, 4))}


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30)).item()


def one_capture(opts: dict, heads: tuple, mode: str, dev, gen) -> tuple[str, float]:
    """('ok' or the error's first line, the replay's largest error against eager)."""
    inputs = [torch.randn(1, 2048, h, 64, device=dev, generator=gen, dtype=torch.bfloat16,
                          requires_grad=True) for h in heads]
    do = torch.randn(1, 2048, heads[0], 64, device=dev, generator=gen, dtype=torch.bfloat16)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up on a side stream, as PyTorch's docs do
        for _ in range(3):
            mb.burst_attn(*inputs, **opts).backward(do)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    for t in inputs:
        t.grad = None
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph, capture_error_mode=mode):
            out = mb.burst_attn(*inputs, **opts)
            out.backward(do)
    except Exception as e:  # noqa: BLE001 - what failed is the measurement
        torch.cuda.synchronize()
        return f"{type(e).__name__}: {str(e).splitlines()[0]}"[:200], float("nan")
    graph.replay()
    eager_in = [t.detach().clone().requires_grad_() for t in inputs]
    ref = mb.burst_attn(*eager_in, **opts)
    ref.backward(do)
    torch.cuda.synchronize()
    errs = [rel(out, ref)] + [rel(a.grad, b.grad) for a, b in zip(inputs, eager_in)]
    return "ok", max(errs)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--modes", default="global,thread_local")
    p.add_argument("--out", required=True)
    args = p.parse_args()
    rank, world = start_ranks()
    dev = torch.device("cuda", torch.cuda.current_device())
    gen = torch.Generator(device=dev).manual_seed(rank + 7)
    rows = []
    for mode in args.modes.split(","):
        for name, (opts, heads) in CASES.items():
            for r in range(args.rounds):
                try:
                    status, err = one_capture(opts, heads, mode, dev, gen)
                except Exception:  # noqa: BLE001 - the replay or eager call failed
                    status, err = "after capture: " + traceback.format_exc(limit=1)[-160:], 0.0
                got = [None] * world
                dist.all_gather_object(got, (status, err))
                rows.append(dict(mode=mode, case=name, round=r,
                                 status=[g[0] for g in got], err=max(g[1] for g in got)))
                if rank == 0:
                    print(mode, name, r, rows[-1]["status"], f"{rows[-1]['err']:.2e}",
                          flush=True)
    if rank == 0:
        meta = dict(command="torchrun --nproc_per_node=%d %s" % (world, " ".join(sys.argv)),
                    device=torch.cuda.get_device_name(dev), gpus=world,
                    torch=torch.__version__, package=ran_package())
        with open(args.out, "w") as f:
            json.dump(dict(meta=meta, rows=rows), f, indent=1)
    dist.barrier()
    os._exit(0)  # NCCL's teardown can wait on graphs that hold its kernels


if __name__ == "__main__":
    main()
