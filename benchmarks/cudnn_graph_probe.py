"""Whether cuDNN builds a new graph for a block cut from a buffer of a new length (one GPU).

    python benchmarks/cudnn_graph_probe.py --out $OUT/cudnn_graph_probe

PyTorch keys cuDNN's attention graphs by the tensors' sizes and strides. A ring's K/V
arrive in a buffer whose length follows the mask, so a block of fixed shape cut from it has
a batch stride that changes with every new pack. This times the package's cuDNN forward and
backward (``CudnnAttention``) on a 2,048 x 2,048 block of 64:8 heads, d 128, bf16, cut from
buffers of ``--lengths`` rows, once per buffer, first as the batch stride falls and then
with it set from the block's own rows (``cuda._batch_strided``, the package's way): a new
graph costs tens of milliseconds, a cached one about one.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from megatron_burst.kernels import cuda  # noqa: E402
from megatron_burst.plan.blocks import Block  # noqa: E402


def first_calls(lengths: list[int], canonical: bool) -> list[float]:
    """ms of one forward + backward on a 2,048-row block of a buffer of each length."""
    kernel, block, rows = cuda.CudnnAttention(), Block(0, 2048, 0, 2048, "causal"), 2048
    keep = cuda._batch_strided
    if not canonical:  # as before: the view's own batch stride
        cuda._batch_strided = lambda t: t  # noqa: E731
    try:
        out = []
        for n in lengths:
            q = torch.randn(1, n, 64, 128, device="cuda", dtype=torch.bfloat16)[:, :rows]
            k, v = (torch.randn(1, n, 8, 128, device="cuda", dtype=torch.bfloat16)[:, -rows:]
                    for _ in range(2))
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            o, lse = kernel.forward(q, k, v, block, 128 ** -0.5)
            kernel.backward(torch.ones_like(o), q, k, v, o, lse, block, 128 ** -0.5)
            torch.cuda.synchronize()
            out.append((time.perf_counter() - t0) * 1e3)
        return out
    finally:
        cuda._batch_strided = keep


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, help="path prefix: writes OUT.json")
    p.add_argument("--lengths", default="8192,8320,8448,8576,8704,8832")
    args = p.parse_args()
    lengths = [int(x) for x in args.lengths.split(",")]
    first_calls([4096], True)  # the first call of the process: the library's own start
    rows = {way: first_calls(lengths, way == "batch stride from the block")
            for way in ("batch stride from the buffer", "batch stride from the block")}
    run = dict(device=torch.cuda.get_device_name(), torch=torch.__version__,
               cudnn=torch.backends.cudnn.version(), lengths=lengths, ms=rows,
               command=" ".join(["benchmarks/cudnn_graph_probe.py", *sys.argv[1:]]))
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out + ".json", "w") as f:
        json.dump(run, f, indent=1)
    for way, ms in rows.items():
        print(f"{way}: " + " ".join(f"{x:.1f}" for x in ms) + " ms")


if __name__ == "__main__":
    main()
