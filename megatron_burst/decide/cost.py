"""Communication cost of the burst ring: the bytes each rank sends, per pass and mode.

These formulas are the contract ``count_comm()`` is tested against, and the byte terms of
the time model (``timing``, which decides ``backward="auto"`` in seconds). Per rank, with G
ranks, T local tokens (batch x local sequence), e bytes per element of q/k/v, fp32 (4-byte) gradient
accumulators and fp32 lse/delta, Q/K head dim d and V head dim dv (MLA: d = 192, dv = 128;
otherwise dv = d, and every formula below is the one of d alone):

- forward: K and V make G-1 hops: (G-1) * T * hkv*(d + dv)*e.
- backward "ring" (K/V travel, dK/dV accumulate while travelling, then go home):
  (G-1) * T * hkv*(d + dv)*e  +  (G-1) * T * hkv*(d + dv)*4.
- backward "burst" (K/V/dK/dV stay home; Q, dO, lse, delta travel; dQ on a second ring):
  (G-1) * T * (hq*(d + dv)*e + 2*hq*4)  +  (G-1) * T * hq*d*4   (Q and dQ at d, dO at dv).
An accumulator starts at the first holder after its owner (the owner's own step-0
gradients never leave home) and its last hop is the one home: G-1 hops. Where it has a single
holder (G = 2, or a window that reaches one neighbour) it carries that holder's one kernel
partial per row, which the inputs' own dtype holds exactly, so it travels at e bytes, not 4
(``acc_elem_bytes``; the plan's exact rule is ``call_plan.PassPlan.wire``).

These are the formulas for a plain sequence, where every row travels. With a window or
packed documents the schedule sends less (``schedule.RingSchedule.needed_rows``), and
``ring_pass_bytes`` counts exactly what it sends.

For MHA at d=128 in bf16 the burst backward sends 0.67x the ring's bytes; with GQA the
ring wins as soon as hq/hkv exceeds about 1.5.

Attention sinks (a learnable logit per query head) add no byte: they are merged into each
row's (out, lse) after the ring, on the rank that holds the row, and their gradient is a
per-head sum over this rank's rows that Megatron's gradient reduction adds up.
"""
from __future__ import annotations

from typing import Sequence

def kv_row_bytes(hkv: int, head_dim: int, elem_bytes: int, v_head_dim: int | None = None
                 ) -> int:
    """Bytes of one token's K and V (each at its own head dim)."""
    return hkv * (head_dim + _dv(head_dim, v_head_dim)) * elem_bytes


def acc_elem_bytes(elem_bytes: int, one_partial: bool) -> int:
    """Bytes per element of a travelling gradient accumulator: the inputs' own where it
    takes one kernel partial a row (``plan.blocks.one_partial``: held exactly), else fp32."""
    return elem_bytes if one_partial and elem_bytes < 4 else 4


def burst_row_bytes(hq: int, head_dim: int, elem_bytes: int, v_head_dim: int | None = None,
                    acc_bytes: int = 4) -> tuple[int, int]:
    """(payload, accumulator) bytes of one token in the burst backward: Q at d, dO at dv
    and the fp32 lse and delta travel; the dQ accumulator (``acc_bytes`` an element) is at d."""
    payload = hq * (head_dim + _dv(head_dim, v_head_dim)) * elem_bytes + 2 * hq * 4
    return payload, hq * head_dim * acc_bytes


def backward_row_bytes(mode: str, hq: int, hkv: int, head_dim: int, elem_bytes: int,
                       v_head_dim: int | None, acc_bytes: int) -> tuple[int, int]:
    """(payload, accumulator) bytes of one travelling token in the backward ring of ``mode``:
    'ring', K/V and their dK/dV (``acc_bytes`` an element); 'burst', ``burst_row_bytes``."""
    if mode == "burst":
        return burst_row_bytes(hq, head_dim, elem_bytes, v_head_dim, acc_bytes)
    return (kv_row_bytes(hkv, head_dim, elem_bytes, v_head_dim),
            kv_row_bytes(hkv, head_dim, acc_bytes, v_head_dim))


def forward_bytes(world: int, tokens: int, hkv: int, head_dim: int, elem_bytes: int,
                  hops: int | None = None, *, v_head_dim: int | None = None) -> int:
    """Bytes one rank sends in the forward ring.

    ``hops`` is the number of ring steps after the first that compute anything (G-1
    unless a sliding window lets the schedule stop early). ``v_head_dim``: V's head dim
    where it differs from Q/K's (MLA); None: ``head_dim``.
    """
    hops = world - 1 if hops is None else hops
    return hops * tokens * kv_row_bytes(hkv, head_dim, elem_bytes, v_head_dim)


def backward_bytes(mode: str, world: int, tokens: int, hq: int, hkv: int, head_dim: int,
                   elem_bytes: int, hops: int | None = None, *,
                   v_head_dim: int | None = None, acc_bytes: int | None = None) -> int:
    """Bytes one rank sends in the backward ring of ``mode`` ('burst' or 'ring').

    The payload makes ``hops`` hops and so do the gradient accumulators (the last one home).
    ``acc_bytes``: the accumulators' bytes per element on the wire; by default as a ring of
    ``hops`` holders sends them (``acc_elem_bytes``: the inputs' own for one holder). A
    caller pricing one hop of a longer ring, or an upper bound (4), says so.
    """
    hops = world - 1 if hops is None else hops
    if acc_bytes is None:
        acc_bytes = acc_elem_bytes(elem_bytes, hops == 1)
    if mode not in ("burst", "ring"):
        raise ValueError(f"backward must be 'burst' or 'ring', got {mode!r}")
    if hops == 0:
        return 0
    payload, acc = backward_row_bytes(mode, hq, hkv, head_dim, elem_bytes, v_head_dim,
                                      acc_bytes)
    return hops * tokens * (payload + acc)


def ulysses_bytes(ulysses: int, tokens: int, hq: int, hkv: int, head_dim: int,
                  elem_bytes: int, *, lse_returned: bool = False,
                  v_head_dim: int | None = None) -> tuple[int, int]:
    """(forward, backward) bytes one rank sends in the Ulysses all-to-alls of one call.

    Each all-to-all keeps 1/U of a tensor and sends the rest. Forward: q, k, v in (k/v
    replicated to U heads when hkv < U), out (V's head dim) back, and the fp32 lse back only
    when the call returns it. Backward: dO in, dQ, dK, dV back, and d(lse) in when the call
    returned lse (on every rank, used in its loss or not: ``ulysses.outputs_to_heads``).
    """
    if ulysses == 1:
        return 0, 0
    dv = _dv(head_dim, v_head_dim)
    hkv = max(hkv, ulysses)
    rest = (ulysses - 1) * tokens
    qkv = rest * (hq * head_dim + hkv * (head_dim + dv)) * elem_bytes // ulysses
    out = rest * hq * dv * elem_bytes // ulysses
    lse = rest * hq * 4 // ulysses
    lse = lse if lse_returned else 0
    return qkv + out + lse, out + qkv + lse


def _dv(head_dim: int, v_head_dim: int | None) -> int:
    return head_dim if v_head_dim is None else v_head_dim


def ring_pass_bytes(topo, rows: Sequence[Sequence[int]], payload_row: int,
                    acc_row: int = 0) -> int:
    """Bytes position ``topo.index`` of ``topo`` (a ``comm.RingPositions``) sends in one pass.

    ``rows[o][s]``: rows of origin o's payload used from step s on (the schedule's
    ``needed_rows``). Each hop carries what its receiver uses (``comm.payload_hops``); from
    step 1 the holder of a payload that travels sends its accumulator of ``rows[o][1]``
    rows on (``comm.AccumulatorRoute``). ``payload_row`` / ``acc_row``: bytes per row.
    """
    from ..comm.ring_positions import payload_hops  # the same hop plan the ring runs

    table = lambda origin, step: rows[origin][step]  # noqa: E731
    total = 0
    for step in range(topo.size):
        total += payload_row * sum(h[2] for h in payload_hops(topo, step, table))
        origin = topo.source(topo.index, step)
        if step and acc_row and rows[origin][step]:
            total += acc_row * rows[origin][1]
    return total
