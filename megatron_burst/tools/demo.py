"""A self-contained demonstration: BurstAttention on CPU ranks equals one-process attention.

    python -m megatron_burst.tools.demo [--world 4] [--seq 2048] [--heads 8:8] [--dim 64]

Spawns ``--world`` gloo ranks, shards a random causal problem zigzag-wise, runs forward
and backward with each backward mode, and prints the error against attention computed on
the whole sequence in one process, plus the bytes each rank sent (``count_comm``).
"""
from __future__ import annotations

import argparse
import os
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import megatron_burst as mb


def _rank_main(rank: int, world: int, port: int, args: argparse.Namespace, results) -> None:
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    hq, hkv = (int(x) for x in args.heads.split(":"))
    gen = torch.Generator().manual_seed(0)
    q, k, v, do = (torch.randn(1, args.seq, h, args.dim, generator=gen)
                   for h in (hq, hkv, hkv, hq))
    ref = [t.clone().requires_grad_() for t in (q, k, v)]
    ref_out = torch.nn.functional.scaled_dot_product_attention(
        *(t.transpose(1, 2) for t in ref), is_causal=True, enable_gqa=True).transpose(1, 2)
    ref_out.backward(do)
    rows = []
    for mode in ("burst", "ring", "auto"):
        local = [mb.shard_seq(t, layout="zigzag").requires_grad_() for t in (q, k, v)]
        with mb.count_comm() as stats:
            out = mb.burst_attn(*local, causal=True, backward=mode)
            out.backward(mb.shard_seq(do))
        err = max((mb.unshard_seq(a.detach()) - b).abs().max().item() for a, b in
                  zip([out] + [t.grad for t in local],
                      [ref_out.detach()] + [t.grad for t in ref]))
        rows.append((mode, err, stats.forward_bytes, stats.backward_bytes))
    if rank == 0:
        results.put(rows)
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world", type=int, default=4)
    parser.add_argument("--seq", type=int, default=2048, help="total tokens")
    parser.add_argument("--heads", default="8:8", help="q heads : k/v heads")
    parser.add_argument("--dim", type=int, default=64)
    args = parser.parse_args(argv)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    results = ctx.SimpleQueue()
    mp.start_processes(_rank_main, args=(args.world, port, args, results), nprocs=args.world,
                       start_method="spawn")
    rows = results.get()
    print(f"causal attention, {args.seq} tokens over {args.world} ranks (zigzag), heads "
          f"{args.heads}, d={args.dim}, fp32")
    print(f"{'backward':>8} {'max |err|':>10} {'fwd MB/rank':>12} {'bwd MB/rank':>12}")
    for mode, err, fwd, bwd in rows:
        print(f"{mode:>8} {err:>10.2e} {fwd / 2**20:>12.2f} {bwd / 2**20:>12.2f}")


if __name__ == "__main__":
    main()
