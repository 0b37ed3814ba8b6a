"""Does a CUDA graph the user captures still work after a given pattern of eager calls?

    MODE=auto V=warm,bwdonly torchrun --nproc_per_node=2 benchmarks/capture_after_eager.py

Why: on 2x H100 (torch 2.11, NCCL) ``torch.cuda.make_graphed_callables`` of a CP=2 ring call
failed (``cudaErrorStreamCaptureInvalidated`` at the forward's first merge launch) after
``benchmarks/host_time.py``'s eager timing of the same call. This reproduces the eager part
step by step, so the pattern that breaks the capture can be found. ``MODE`` is
``MEGATRON_BURST_REPLAY`` (``attention.replay``; its guard against a capture after replays
is lifted here, to see what the capture itself does). ``V`` lists the steps run eagerly on
the ring-backward call (256 tokens per GPU, 16:4 heads, d 64, bf16) before the capture:

  burst   the burst-backward call first, eagerly (warm) and captured, as host_time does
  warm    3 fwd+bwd              fwdonly  15 forwards kept, each after a barrier
  both    15 fwd+bwd, each after a sync and a barrier
  bwdonly 15 x (fwd, sync, barrier, bwd)      fs  15 x (fwd, sync, bwd)
  fb      15 x (fwd, barrier, bwd)            fk  15 x (fwd, all_reduce, bwd)
  sleep   1 s before capturing                clear  drop the replay graphs first

Each rank prints one ``RESULT`` line (ok, or the error), and appends it to ``--out``.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import torch
import torch.distributed as dist

os.environ["MEGATRON_BURST_REPLAY"] = os.environ.get("MODE", "auto")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import megatron_burst as mb  # noqa: E402
from megatron_burst.attention import replay  # noqa: E402
from megatron_burst.comm import consensus  # noqa: E402
from ranks import host_and_wall_ms, start_ranks  # noqa: E402

SHAPES = [(1, 256, 16, 64), (1, 256, 4, 64), (1, 256, 4, 64)]


def _unguarded(run):
    """``replay.run`` without its refusal of a capture after replays."""
    def call(name, bound, tensors, pass_):
        return None if consensus.capturing() else run(name, bound, tensors, pass_)
    return call


def _eager(steps, fn, inputs, do, dev) -> None:
    loops = {"fs": lambda o: torch.cuda.synchronize(), "fb": lambda o: dist.barrier(),
             "fk": lambda o: dist.all_reduce(torch.ones(1, device=dev)),
             "bwdonly": lambda o: (torch.cuda.synchronize(), dist.barrier())}
    if "warm" in steps:
        for _ in range(3):
            fn(*inputs).backward(do)
    if "fwdonly" in steps:
        kept = []
        host_and_wall_ms(lambda: kept.append(fn(*inputs)), 15)
    if "both" in steps:
        host_and_wall_ms(lambda: fn(*inputs).backward(do), 15)
    for name, between in loops.items():
        if name in steps:
            for _ in range(15):
                out = fn(*inputs)
                between(out)
                out.backward(do)


def run_case(backward: str, steps: list[str], rank: int, dev) -> None:
    gen = torch.Generator(device=dev).manual_seed(rank)
    inputs = [torch.randn(s, device=dev, dtype=torch.bfloat16, generator=gen,
                          requires_grad=True) for s in SHAPES]
    do = torch.randn(SHAPES[0], device=dev, dtype=torch.bfloat16, generator=gen)

    def fn(q, k, v):
        return mb.burst_attn(q, k, v, causal=True, backward=backward)

    _eager(steps, fn, inputs, do, dev)
    torch.cuda.synchronize()
    if "sleep" in steps:
        time.sleep(1.0)
    if "clear" in steps:
        replay.clear()
    graphed = torch.cuda.make_graphed_callables(fn, tuple(inputs), num_warmup_iters=3)
    for _ in range(3):
        graphed(*inputs).backward(do)
    torch.cuda.synchronize()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="a text file each rank appends to")
    args = parser.parse_args()
    replay.run = _unguarded(replay.run)
    rank, _ = start_ranks()
    dev = torch.device("cuda", torch.cuda.current_device())
    steps = os.environ.get("V", "warm").split(",")
    said = f"MODE={os.environ['MEGATRON_BURST_REPLAY']} V={','.join(steps)} rank {rank}: "
    code = 0
    try:
        if "burst" in steps:
            run_case("burst", steps, rank, dev)
        run_case("ring", steps, rank, dev)
        said += "ok"
    except Exception as e:  # noqa: BLE001  (what the capture raised is the result)
        said += f"FAILED {type(e).__name__}: {str(e).splitlines()[0][:120]}"
        code = 1
    print("RESULT " + said, flush=True)
    if args.out:
        with open(args.out, "a") as f:
            f.write(said + "\n")
    if code == 0:
        dist.barrier()
    torch.cuda.synchronize()
    os._exit(code)  # NCCL's teardown after captured graphs hangs (NOTES)


if __name__ == "__main__":
    main()
