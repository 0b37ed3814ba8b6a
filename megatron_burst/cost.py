"""Communication cost of the burst ring: the bytes each rank sends, per pass and mode.

These formulas are the contract ``count_comm()`` is tested against, and what
``backward="auto"`` uses to pick a backward mode. Per rank, with G ranks, T local tokens
(batch x local sequence), e bytes per element of q/k/v, fp32 (4-byte) gradient
accumulators and fp32 lse/delta:

- forward: K and V make G-1 hops: (G-1) * T * 2*hkv*d*e.
- backward "ring" (K/V travel, dK/dV accumulate while travelling, then go home):
  (G-1) * T * 2*hkv*d*e  +  G * T * 2*hkv*d*4.
- backward "burst" (K/V/dK/dV stay home; Q, dO, lse, delta travel; dQ on a second ring):
  (G-1) * T * (2*hq*d*e + 2*hq*4)  +  G * T * hq*d*4.

For MHA at d=128 in bf16 the burst backward sends 0.67x the ring's bytes; with GQA the
ring wins as soon as hq/hkv exceeds about 1.5.
"""
from __future__ import annotations

BACKWARD_MODES = ("burst", "ring", "auto")


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

    The payload makes ``hops`` hops and the gradient accumulators hops+1 (the last one
    home).
    """
    hops = world - 1 if hops is None else hops
    if hops == 0:
        return 0
    if mode == "ring":
        return (hops * tokens * 2 * hkv * head_dim * elem_bytes
                + (hops + 1) * tokens * 2 * hkv * head_dim * 4)
    if mode == "burst":
        return (hops * tokens * (2 * hq * head_dim * elem_bytes + 2 * hq * 4)
                + (hops + 1) * tokens * hq * head_dim * 4)
    raise ValueError(f"backward must be 'burst' or 'ring', got {mode!r}")


def choose_backward(world: int, hq: int, hkv: int, head_dim: int, elem_bytes: int) -> str:
    """The backward mode that sends fewer bytes (ties go to 'burst', the paper's)."""
    burst = backward_bytes("burst", max(world, 2), 1, hq, hkv, head_dim, elem_bytes)
    ring = backward_bytes("ring", max(world, 2), 1, hq, hkv, head_dim, elem_bytes)
    return "burst" if burst <= ring else "ring"


# ------------------------------------------------------------------------- the plan

import dataclasses  # noqa: E402  (the plan needs it; the byte formulas above do not)


@dataclasses.dataclass(frozen=True)
class Cluster:
    """Links and kernel rate of the machines: CP positions per node, achieved GB/s per
    direction inside and between nodes, attention fwd+bwd TFLOP/s. The figures per GPU
    type live in one place, ``launch.config.HARDWARE``."""

    gpus_per_node: int
    intra_gbps: float
    inter_gbps: float
    kernel_tflops: float
    gpu_memory_gib: float


@dataclasses.dataclass(frozen=True)
class AttentionPlan:
    """What one attention layer costs per rank, per ring step and in total."""

    cp: int
    intra_node_size: int | None
    ulysses: int
    backward: str
    ring_size: int
    tokens_per_member: int
    step_flops_fwd: float
    step_compute_fwd_s: float
    step_bytes_fwd: int
    step_bytes_bwd: int
    step_comm_fwd_s: float
    step_comm_bwd_s: float
    inter_comm_fwd_s: float
    round_compute_fwd_s: float
    a2a_bytes: int
    a2a_s: float
    inter_node_bytes: int  # bytes the busiest rank sends over the inter-node link, fwd
    comm_hidden: bool
    layer_time_s: float
    memory_bytes: int
    notes: tuple[str, ...]

    def explain(self) -> list[str]:
        ms = 1e3
        lines = [
            f"CP={self.cp} = Ulysses {self.ulysses} x ring {self.ring_size}"
            + (f" (double ring, {self.intra_node_size // self.ulysses} ring positions per node)"
               if self.intra_node_size else " (flat ring)"),
            f"backward mode: {self.backward}",
            f"per ring step: compute fwd {self.step_compute_fwd_s * ms:.2f} ms, "
            f"send fwd {self.step_bytes_fwd / 2**20:.1f} MiB ({self.step_comm_fwd_s * ms:.2f} ms), "
            f"bwd {self.step_bytes_bwd / 2**20:.1f} MiB ({self.step_comm_bwd_s * ms:.2f} ms)",
        ]
        if self.inter_comm_fwd_s:
            lines.append(f"inter-node hop: {self.inter_comm_fwd_s * ms:.2f} ms against "
                         f"{self.round_compute_fwd_s * ms:.2f} ms of compute per round")
        if self.ulysses > 1:
            lines.append(f"Ulysses all-to-all: {self.a2a_bytes / 2**20:.1f} MiB "
                         f"({self.a2a_s * ms:.2f} ms)")
        lines.append(f"communication hidden under compute: {'yes' if self.comm_hidden else 'NO'}")
        lines.append(f"attention layer fwd+bwd ~{self.layer_time_s * ms:.1f} ms; ring buffers "
                     f"and accumulators {self.memory_bytes / 2**30:.2f} GiB per rank")
        return lines + list(self.notes)


def _visible_fraction(seq: int, causal: bool, window: int) -> float:
    """Fraction of the N x N score matrix that is computed."""
    if window >= 0 and window < seq:
        w = window + 1
        pairs = w * seq - w * (w - 1) / 2 if causal else (2 * window + 1) * seq - window * (
            window + 1)
        return pairs / seq / seq
    return 0.5 if causal else 1.0


def plan_attention(*, seq_len: int, batch: int, hq: int, hkv: int, head_dim: int, cp: int,
                   causal: bool = True, window: int = -1, elem_bytes: int = 2,
                   intra_node_size: int | None = None, ulysses: int = 1,
                   backward: str = "auto", cluster: Cluster) -> AttentionPlan:
    """Model one attention layer's ring: bytes per step per link, times, memory.

    Balanced work per step (zigzag) is assumed; windows shrink compute, not the traffic of
    the zigzag ring. Times are max(compute, comm) per step, i.e. overlap is assumed
    perfect when hidden.
    """
    if cp % ulysses or hq % ulysses:
        raise ValueError(f"ulysses ({ulysses}) must divide cp ({cp}) and the heads ({hq})")
    ring = cp // ulysses
    hq_r, hkv_r = hq // ulysses, max(hkv // ulysses, 1)
    tokens = batch * seq_len // ring
    vis = _visible_fraction(seq_len, causal, window)
    step_flops = 4 * tokens * tokens * hq_r * head_dim * vis
    rate = cluster.kernel_tflops * 1e12 / 3.5  # fwd rate; fwd+bwd = 3.5x fwd FLOPs
    step_fwd_s = step_flops / rate
    nodes = max(1, cp // cluster.gpus_per_node)
    double = intra_node_size is not None and nodes > 1
    # Ring hops stay inside a node only when the whole ring fits in one node.
    hop_gbps = cluster.intra_gbps if (nodes == 1 or double) else cluster.inter_gbps
    if backward == "auto":
        backward = choose_backward(ring, hq_r, hkv_r, head_dim, elem_bytes)
    fwd_b = forward_bytes(2, tokens, hkv_r, head_dim, elem_bytes)
    bwd_b = backward_bytes(backward, 2, tokens, hq_r, hkv_r, head_dim, elem_bytes) // 2
    fwd_s, bwd_s = fwd_b / (hop_gbps * 1e9), bwd_b / (hop_gbps * 1e9)
    inter_s = round_s = 0.0
    notes = []
    if double:
        positions = intra_node_size // ulysses
        inter_s = fwd_b / (cluster.inter_gbps * 1e9)
        round_s = positions * step_fwd_s
    hidden = fwd_s <= step_fwd_s and bwd_s <= 2.5 * step_fwd_s and inter_s <= max(round_s,
                                                                                  step_fwd_s)
    a2a = 0
    if ulysses > 1:
        local = batch * seq_len // cp
        a2a = (ulysses - 1) * local * (2 * hq + 2 * hkv) * head_dim * elem_bytes // ulysses
    a2a_s = 3 * a2a / (cluster.intra_gbps * 1e9)  # forward, and twice in backward
    layer = ring * (max(step_fwd_s, fwd_s) + max(2.5 * step_fwd_s, bwd_s)) + a2a_s
    mem = (tokens * hq_r * head_dim * 4 * 2        # fp32 out and dQ accumulators
           + 2 * tokens * 2 * hkv_r * head_dim * elem_bytes  # K/V double buffer
           + tokens * 2 * hkv_r * head_dim * 4 * 2)          # dK/dV accumulators in flight
    if not hidden:
        need = tokens
        while need < 64 * tokens and 4 * need * hq_r * head_dim * vis / rate < fwd_b * (
                need / tokens) / (hop_gbps * 1e9):
            need *= 2
        notes.append(f"ring traffic is exposed: raise tokens per rank (~{need} needed), use the "
                     "double ring, or move heads into Ulysses")
    if ulysses == 1 and hkv < hq and backward == "ring":
        notes.append(f"GQA {hq}:{hkv}: the ring backward moves fewer bytes than burst")
    # A flat ring across nodes makes the rank at each node boundary send every hop over
    # the inter-node link; the double ring sends each payload across once per round.
    inter_bytes = 0 if nodes == 1 else (nodes - 1 if double else ring - 1) * fwd_b
    return AttentionPlan(cp, intra_node_size, ulysses, backward, ring, tokens, step_flops,
                         step_fwd_s, fwd_b, bwd_b, fwd_s, bwd_s, inter_s, round_s, a2a, a2a_s,
                         inter_bytes, hidden, layer, mem, tuple(notes))


def best_plan(*, cp: int, cluster: Cluster, **shape) -> AttentionPlan:
    """The fastest of the flat ring, the double ring and each Ulysses size that fits."""
    node = min(cp, cluster.gpus_per_node)
    options = [dict(intra_node_size=None, ulysses=1)]
    if cp > node:
        options.append(dict(intra_node_size=node, ulysses=1))
    for u in range(2, node + 1):
        if node % u == 0 and cp % u == 0 and shape["hq"] % u == 0:
            options.append(dict(intra_node_size=node if cp > node else None, ulysses=u))
    plans = [plan_attention(cp=cp, cluster=cluster, **shape, **opt) for opt in options]
    # Equal times (communication hidden either way): prefer less inter-node traffic, then
    # the pure ring (no all-to-all).
    return min(plans, key=lambda p: (round(p.layer_time_s, 4), p.inter_node_bytes, p.ulysses))
