"""Whether a kernel's in-place varlen forward computes what it must: probed before it is used.

The in-place form (``varlen.InPlaceBounds``) hands the kernel the whole Q, K and V with
sequences that start anywhere in K (flash's ``seqused_k``), key ranges that overlap, and
query rows between blocks as sequences of no keys. Each of those is a corner a kernel
version may not take (an older PyTorch lacks the argument; a kernel may read the keys from
the packed end of the previous sequence), so the ring uses the form only on a kernel whose
answer on such calls matches the reference's, row for row (``probe_in_place``, once per
kernel, head shape, dtype and device, in ``selection``).

Apart from ``selection`` because it is one question with its own tiny calls; ``selection``
asks it.
"""
from __future__ import annotations

import torch

from ..plan.schedule import Block
from .reference import ReferenceAttention
from .varlen import plan_calls

# Three calls (causal, full, one window) whose blocks skip query rows (gaps, and rows after
# the last block), read overlapping key ranges, and start their keys past row 0.
_BLOCKS = (Block(0, 40, 0, 40, "causal"), Block(70, 110, 20, 60, "causal"),
           Block(112, 150, 90, 128, "causal"),
           Block(0, 30, 10, 75, "full"), Block(50, 90, 0, 130, "full"),
           Block(90, 100, 64, 70, "full"),
           Block(0, 40, 0, 50, "band", -20, 10), Block(60, 100, 30, 80, "band", -20, 10))
_ROWS = 160  # query and key rows: past every block


def probe_in_place(kernel, dtype: torch.dtype, hq: int, hkv: int, d: int,
                   device: torch.device, dv: int | None = None) -> bool:
    """Whether ``kernel.forward_varlen_in_place`` gives the reference's out and lse on
    every row of every block of three probe calls; False where it raises or differs."""
    dv = d if dv is None else dv
    try:
        gen = torch.Generator(device="cpu").manual_seed(2)
        q = torch.randn(_ROWS, hq, d, generator=gen).to(device, dtype)
        k = torch.randn(_ROWS, hkv, d, generator=gen).to(device, dtype)
        v = torch.randn(_ROWS, hkv, dv, generator=gen).to(device, dtype)
        calls = [c for c in plan_calls(_BLOCKS, varlen=True, dense_min_area=float("inf"),
                                       coalesce=False) if c.in_place is not None]
        if len(calls) != 3:
            return False  # (the probe's own blocks: every call has the form)
        ok = True
        for call in calls:
            out, lse = kernel.forward_varlen_in_place(q, k, v, call, d ** -0.5)
            r_out, r_lse = ReferenceAttention().forward_varlen_in_place(q, k, v, call,
                                                                       d ** -0.5)
            for blk in call.blocks:
                rows = slice(blk.q_start, blk.q_stop)
                ok = ok and torch.allclose(out[rows].float(), r_out[rows].float(), atol=3e-2)
                ok = ok and torch.allclose(lse[:, rows].float(), r_lse[:, rows].float(),
                                           atol=2e-2)
        return bool(ok)
    except Exception:  # the argument missing, or a shape refused: the packed form only
        return False
