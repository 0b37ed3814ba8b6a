"""What one attention layer's ring costs on a cluster: bytes and times per step, hiding, memory.

The planner behind `megatron-burst plan`. It reads the run's `CPLayout` (topology, heads,
backward mode, bytes per hop from `megatron_burst.cost`) and the cluster's link and kernel
rates, and models one layer: per ring step, is the hop hidden under the step's compute?
Balanced work per step (zigzag) is assumed; windows shrink compute, not ring traffic. Times
are max(compute, comm) per step, i.e. overlap is assumed perfect when hidden.
"""
from __future__ import annotations

import dataclasses

from .. import cost
from ..cp_layout import CPLayout
from .config import Config
from .units import format_bytes


@dataclasses.dataclass(frozen=True)
class Cluster:
    """Links and kernel rate as the CP group sees them: CP ranks per node, achieved GB/s per
    direction inside and between nodes, attention fwd+bwd TFLOP/s. The figures per GPU type
    live in one place, ``launch.config.HARDWARE``."""

    cp_ranks_per_node: int
    intra_gbps: float
    inter_gbps: float
    kernel_tflops: float


@dataclasses.dataclass(frozen=True)
class AttentionPlan:
    """What one attention layer costs per rank, per ring step and in total."""

    layout: CPLayout
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
            self.layout.describe(),
            f"per ring step: compute fwd {self.step_compute_fwd_s * ms:.2f} ms, "
            f"send fwd {format_bytes(self.step_bytes_fwd)} ({self.step_comm_fwd_s * ms:.2f} ms), "
            f"bwd {format_bytes(self.step_bytes_bwd)} ({self.step_comm_bwd_s * ms:.2f} ms)",
        ]
        if self.inter_comm_fwd_s:
            lines.append(f"inter-node hop: {self.inter_comm_fwd_s * ms:.2f} ms against "
                         f"{self.round_compute_fwd_s * ms:.2f} ms of compute per round")
        if self.layout.ulysses > 1:
            lines.append(f"Ulysses all-to-all: {format_bytes(self.a2a_bytes)} "
                         f"({self.a2a_s * ms:.2f} ms)")
        lines.append(f"communication hidden under compute: {'yes' if self.comm_hidden else 'NO'}")
        lines.append(f"attention layer fwd+bwd ~{self.layer_time_s * ms:.1f} ms; ring buffers "
                     f"and accumulators {format_bytes(self.memory_bytes)} per rank")
        return lines + list(self.notes)


def _visible_fraction(seq: int, causal: bool, window: int) -> float:
    """Fraction of the N x N score matrix that is computed."""
    if 0 <= window < seq:
        w = window + 1
        pairs = w * seq - w * (w - 1) / 2 if causal else (2 * window + 1) * seq - window * (
            window + 1)
        return pairs / seq / seq
    return 0.5 if causal else 1.0


def plan_attention(layout: CPLayout, *, seq_len: int, batch: int, cluster: Cluster,
                   causal: bool = True, window: int = -1) -> AttentionPlan:
    """Model one attention layer's ring for ``layout`` on ``cluster``."""
    h = layout.heads
    hq_r, hkv_r = layout.ring_heads
    ring = layout.ring_size
    tokens = batch * seq_len // ring
    vis = _visible_fraction(seq_len, causal, window)
    step_flops = 4 * tokens * tokens * hq_r * h.head_dim * vis
    # The kernel's fwd+bwd rate counts 3.5x the forward's FLOPs in 3.5x its time: the same
    # TFLOP/s serves the forward alone.
    rate = cluster.kernel_tflops * 1e12
    step_fwd_s = step_flops / rate
    nodes = max(1, layout.cp // cluster.cp_ranks_per_node)
    double = layout.double and nodes > 1
    # Ring hops stay inside a node only when the whole ring fits in one node.
    hop_gbps = cluster.intra_gbps if (nodes == 1 or double) else cluster.inter_gbps
    fwd_b = cost.forward_bytes(2, tokens, hkv_r, h.head_dim, h.elem_bytes)
    bwd_b = cost.backward_bytes(layout.backward, 2, tokens, hq_r, hkv_r, h.head_dim,
                                h.elem_bytes) // 2
    fwd_s, bwd_s = fwd_b / (hop_gbps * 1e9), bwd_b / (hop_gbps * 1e9)
    inter_s = round_s = 0.0
    if double:
        inter_s = fwd_b / (cluster.inter_gbps * 1e9)
        round_s = layout.inner_ring * step_fwd_s
    hidden = (fwd_s <= step_fwd_s and bwd_s <= 2.5 * step_fwd_s
              and inter_s <= max(round_s, step_fwd_s))
    local = batch * seq_len // layout.cp
    a2a_fwd, a2a_bwd = cost.ulysses_bytes(layout.ulysses, local, h.hq, h.hkv, h.head_dim,
                                          h.elem_bytes)
    a2a = a2a_fwd + a2a_bwd
    a2a_s = a2a / (cluster.intra_gbps * 1e9)
    layer = ring * (max(step_fwd_s, fwd_s) + max(2.5 * step_fwd_s, bwd_s)) + a2a_s
    mem = (tokens * hq_r * h.head_dim * 4 * 2                    # fp32 out and dQ accumulators
           + 2 * tokens * 2 * hkv_r * h.head_dim * h.elem_bytes  # K/V double buffer
           + tokens * 2 * hkv_r * h.head_dim * 4 * 2)             # dK/dV accumulators in flight
    notes = []
    if not hidden:
        need = tokens
        while need < 64 * tokens and 4 * need * hq_r * h.head_dim * vis / rate < fwd_b * (
                need / tokens) / (hop_gbps * 1e9):
            need *= 2
        notes.append(f"ring traffic is exposed: raise tokens per rank (~{need} needed), use the "
                     "double ring, or move heads into Ulysses")
    if layout.ulysses == 1 and h.hkv < h.hq and layout.backward == "ring":
        notes.append(f"GQA {h.hq}:{h.hkv} per TP rank: the ring backward moves fewer bytes "
                     f"than burst")
    # A flat ring across nodes makes the rank at each node boundary send every hop over
    # the inter-node link; the double ring sends each payload across once per round.
    inter_bytes = 0 if nodes == 1 else (nodes - 1 if double else ring - 1) * fwd_b
    return AttentionPlan(layout, tokens, step_flops, step_fwd_s, fwd_b, bwd_b, fwd_s, bwd_s,
                         inter_s, round_s, a2a, a2a_s, inter_bytes, hidden, layer, mem,
                         tuple(notes))


def attention_plan(cfg: Config) -> AttentionPlan:
    """The plan of one attention layer for ``cfg``'s shape, layout and cluster.

    With TP inside the node only gpus_per_node / TP of a node's GPUs belong to one CP group.
    """
    m, p, c = cfg.model, cfg.parallel, cfg.cluster
    hw = c.hardware
    cluster = Cluster(cp_ranks_per_node=max(1, c.gpus_per_node // p.tensor),
                      intra_gbps=hw.intra_node_gbps, inter_gbps=hw.inter_node_gbps,
                      kernel_tflops=hw.attention_tflops)
    return plan_attention(CPLayout.from_run_config(cfg), seq_len=m.seq_length,
                          batch=cfg.training.micro_batch_size, cluster=cluster, causal=True)
