"""Ring send/recv bandwidth between neighbours, as BurstAttention's K/V hop uses it.

    torchrun --nproc_per_node=8 benchmarks/p2p_ring.py --mb 16,67,134,268 --parts 1,2

Every rank sends a payload of --mb megabytes to the next rank and receives one from the
previous, all ranks at once, with one `batch_isend_irecv` per hop (as `comm.PeerComm` does);
`--parts 2` splits the payload into two tensors (K and V). Rank 0 prints GB/s per direction
(payload bytes / median hop time) and writes JSON with the NCCL_* environment, so runs under
different NCCL settings can be compared. With ``$MEGATRON_BURST_EMULATE`` set (see
``ranks.py``) a hop between virtual nodes is emulated: what an emulated link measures.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch
import torch.distributed as dist

from ranks import EMULATE_ENV, start_ranks


def hop_ms(payload: list[torch.Tensor], recv: list[torch.Tensor], to: int, frm: int,
           iters: int) -> float:
    times = []
    for i in range(iters + 3):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        dist.barrier()
        start.record()
        ops = [op for s, r in zip(payload, recv) for op in
               (dist.P2POp(dist.isend, s, to), dist.P2POp(dist.irecv, r, frm))]
        for work in dist.batch_isend_irecv(ops):
            work.wait()
        end.record()
        torch.cuda.synchronize()
        if i >= 3:
            times.append(start.elapsed_time(end))
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", default="16,67,134,268")
    parser.add_argument("--parts", default="1,2")
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--out", default=None)
    parser.add_argument("--label", default="default")
    args = parser.parse_args()
    rank, world = start_ranks()
    to, frm = (rank + 1) % world, (rank - 1) % world
    rows = []
    for mb in (float(x) for x in args.mb.split(",")):
        for parts in (int(x) for x in args.parts.split(",")):
            n = int(mb * 2**20) // 2 // parts  # bf16 elements per part
            payload = [torch.randn(n, device="cuda", dtype=torch.bfloat16) for _ in range(parts)]
            recv = [torch.empty_like(t) for t in payload]
            ms = hop_ms(payload, recv, to, frm, args.iters)
            gbps = parts * n * 2 / ms / 1e6
            rows.append(dict(mb=mb, parts=parts, ms=ms, gb_per_s=gbps))
            if rank == 0:
                print(f"{args.label:>24} {world} ranks {mb:6.0f} MB x{parts}: {ms:7.3f} ms "
                      f"{gbps:6.1f} GB/s per direction", flush=True)
    if rank == 0 and args.out:
        env = {k: v for k, v in os.environ.items()
               if k.startswith("NCCL_") or k == EMULATE_ENV}
        with open(args.out, "w") as f:
            json.dump(dict(label=args.label, world=world, env=env, nccl=torch.cuda.nccl.version(),
                           device=torch.cuda.get_device_name(0),
                           date=time.strftime("%Y-%m-%d %H:%M:%S"), rows=rows), f, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
