"""Communication cost of the burst ring: the bytes each rank sends, per pass and mode.

These formulas are the contract ``count_comm()`` is tested against, and the byte terms of
the time model (``timing``, which decides ``backward="auto"`` in seconds). Per rank, with G ranks, T local tokens
(batch x local sequence), e bytes per element of q/k/v, fp32 (4-byte) gradient
accumulators and fp32 lse/delta:

- forward: K and V make G-1 hops: (G-1) * T * 2*hkv*d*e.
- backward "ring" (K/V travel, dK/dV accumulate while travelling, then go home):
  (G-1) * T * 2*hkv*d*e  +  (G-1) * T * 2*hkv*d*4.
- backward "burst" (K/V/dK/dV stay home; Q, dO, lse, delta travel; dQ on a second ring):
  (G-1) * T * (2*hq*d*e + 2*hq*4)  +  (G-1) * T * hq*d*4.
An accumulator starts at the first holder after its owner (the owner's own step-0
gradients never leave home) and its last hop is the one home: G-1 hops.

These are the formulas for a plain sequence, where every row travels. With a window or
packed documents the schedule sends less (``schedule.RingSchedule.needed_rows``), and
``ring_pass_bytes`` counts exactly what it sends.

For MHA at d=128 in bf16 the burst backward sends 0.67x the ring's bytes; with GQA the
ring wins as soon as hq/hkv exceeds about 1.5.
"""
from __future__ import annotations

from typing import Sequence

def forward_bytes(world: int, tokens: int, hkv: int, head_dim: int, elem_bytes: int,
                  hops: int | None = None) -> int:
    """Bytes one rank sends in the forward ring.

    ``hops`` is the number of ring steps after the first that compute anything (G-1
    unless a sliding window lets the schedule stop early).
    """
    hops = world - 1 if hops is None else hops
    return hops * tokens * 2 * hkv * head_dim * elem_bytes


def backward_bytes(mode: str, world: int, tokens: int, hq: int, hkv: int, head_dim: int,
                   elem_bytes: int, hops: int | None = None) -> int:
    """Bytes one rank sends in the backward ring of ``mode`` ('burst' or 'ring').

    The payload makes ``hops`` hops and so do the gradient accumulators (the last one home).
    """
    hops = world - 1 if hops is None else hops
    if hops == 0:
        return 0
    if mode == "ring":
        return (hops * tokens * 2 * hkv * head_dim * elem_bytes
                + hops * tokens * 2 * hkv * head_dim * 4)
    if mode == "burst":
        return (hops * tokens * (2 * hq * head_dim * elem_bytes + 2 * hq * 4)
                + hops * tokens * hq * head_dim * 4)
    raise ValueError(f"backward must be 'burst' or 'ring', got {mode!r}")


def ulysses_bytes(ulysses: int, tokens: int, hq: int, hkv: int, head_dim: int,
                  elem_bytes: int, *, lse_grad: bool = False) -> tuple[int, int]:
    """(forward, backward) bytes one rank sends in the Ulysses all-to-alls of one call.

    Each all-to-all keeps 1/U of a tensor and sends the rest. Forward: q, k, v in (k/v
    replicated to U heads when hkv < U), out and the fp32 lse back. Backward: dO in, dQ,
    dK, dV back, and d(lse) in only when the lse reaches the loss.
    """
    if ulysses == 1:
        return 0, 0
    hkv = max(hkv, ulysses)
    rest = (ulysses - 1) * tokens
    qkv = rest * (hq + 2 * hkv) * head_dim * elem_bytes // ulysses
    out = rest * hq * head_dim * elem_bytes // ulysses
    lse = rest * hq * 4 // ulysses
    return qkv + out + lse, out + qkv + (lse if lse_grad else 0)


def ring_pass_bytes(topo, rows: Sequence[Sequence[int]], payload_row: int,
                    acc_row: int = 0) -> int:
    """Bytes position ``topo.index`` of ``topo`` (a ``comm.RingTopology``) sends in one pass.

    ``rows[o][s]``: rows of origin o's payload used from step s on (the schedule's
    ``needed_rows``). Each hop carries what its receiver uses (``comm.payload_hops``); from
    step 1 the holder of a payload that travels sends its accumulator of ``rows[o][1]``
    rows on (``comm.AccumulatorRoute``). ``payload_row`` / ``acc_row``: bytes per row.
    """
    from .comm.topology import payload_hops  # the same hop plan the ring runs

    table = lambda origin, step: rows[origin][step]  # noqa: E731
    total = 0
    for step in range(topo.size):
        total += payload_row * sum(h[2] for h in payload_hops(topo, step, table))
        origin = topo.source(topo.index, step)
        if step and acc_row and rows[origin][step]:
            total += acc_row * rows[origin][1]
    return total
