"""The local attention protocol (BurstAttention's LAO): what every kernel computes.

Why apart: the ring (``burst.py``, ``varlen.py``) calls kernels only through this contract,
so a backend is added or chosen (``selection.py``) without the ring knowing which runs.
Every backend computes attention for one ``Block`` of the ring schedule:

    forward(q, k, v, block, scale)  -> (out, lse)
    backward(dout, q, k, v, out, lse, block, scale) -> (dq, dk, dv)

and for many blocks at once, packed back to back (``varlen.KernelLaunch``; tensors
[total, h, d], lse [h, total]):

    forward_varlen(q, k, v, call, scale) -> (out, lse)
    backward_varlen(dout, q, k, v, out, lse, call, scale) -> (dq, dk, dv)

PyTorch's flash kernel (and flash-attn's) do the varlen form in one launch; every other
backend does it by a loop of its own dense calls (``VarlenByLoop``), which is also how the
CPU tests exercise the packing. ``dense_min_area`` tells ``varlen.plan_calls`` from which
block size a dense call beats the varlen kernel; ``gpu_bound_min_area`` (None: the same) the
size for the passes the GPU bounds (``call_plan.build_plan``).

Every backend states what it can run (``Capabilities``: devices, dtypes, block kinds, head
dims, smallest block): ``selection.select_kernel`` checks a call's blocks against it before
the call's first message, so a kernel is never handed a block it would compute wrongly.

Tensors are ``[b, s, h, d]`` views (bshd; sbhd inputs arrive as strided views, never
copied). K/V may have fewer heads than Q (GQA/MQA). ``lse`` is fp32 ``[b, hq, s]``.
``backward`` receives the *final* (merged) ``out`` and ``lse`` of the whole ring, so each
block's gradients are exact pieces of the global gradient. It uses ``out`` only for the
row sums ``delta = rowsum(dout * out)``, which is what lets the burst backward send delta
instead of O (see ``surrogate_out``).
"""
from __future__ import annotations

import dataclasses
from typing import Protocol

import torch

from ..plan.schedule import BLOCK_KINDS, Block

HALF = frozenset({torch.float16, torch.bfloat16})
FLOATS = HALF | {torch.float32, torch.float64}


def working_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype of every accumulator, lse and merge: fp32, or fp64 for fp64 inputs (so the
    tests can check to 1e-12)."""
    return torch.float64 if dtype == torch.float64 else torch.float32


@dataclasses.dataclass(frozen=True)
class Capabilities:
    """What a kernel computes exactly: anything else is refused before it runs.

    ``kinds``: the block kinds one dense call runs ('full', 'causal', 'band');
    ``one_launch_varlen``: whether a varlen call is one launch (else one dense call per
    block, ``VarlenByLoop``); ``max_head_dim`` / ``head_dim_multiple``: the head dims it
    takes; ``min_side``: the fewest query rows or key rows a block may have;
    ``other_v_dim``: whether V's head dim may differ from Q/K's (MLA: 192 and 128); a kernel
    without it runs such calls with the smaller side zero-padded (``padded.PaddedHeads``).
    """

    devices: frozenset
    dtypes: frozenset
    kinds: frozenset = frozenset(BLOCK_KINDS)
    one_launch_varlen: bool = False
    max_head_dim: int | None = None
    head_dim_multiple: int = 1
    min_side: int = 1
    other_v_dim: bool = False

    def tensor_refusal(self, device_type: str, dtype: torch.dtype, head_dim: int) -> str | None:
        """Why tensors of this device, dtype and head dim cannot run here, or None."""
        if device_type not in self.devices:
            return f"runs on {sorted(self.devices)}, not on {device_type} tensors"
        if dtype not in self.dtypes:
            return f"takes {sorted(str(d) for d in self.dtypes)}, not {dtype}"
        if (self.max_head_dim is not None and head_dim > self.max_head_dim) or (
                head_dim % self.head_dim_multiple):
            return (f"takes head dims that are multiples of {self.head_dim_multiple} up to "
                    f"{self.max_head_dim}, not {head_dim}")
        return None

    def block_refusal(self, block: Block) -> str | None:
        """Why this block cannot run here, or None."""
        if block.kind not in self.kinds:
            return f"runs {sorted(self.kinds)} blocks, not {block.kind} ({block.describe()})"
        if min(block.q_stop - block.q_start, block.k_stop - block.k_start) < self.min_side:
            return f"needs blocks of at least {self.min_side} rows, not {block.describe()}"
        return None

    def admits(self, block: Block) -> bool:
        return self.block_refusal(block) is None

    @property
    def runs_every_block(self) -> bool:
        """Whether no block is refused: every kind, down to one row."""
        return self.kinds >= set(BLOCK_KINDS) and self.min_side <= 1


class LocalAttention(Protocol):
    name: str
    dense_min_area: float
    gpu_bound_min_area: float | None
    capabilities: Capabilities
    varlen_in_place: bool  # the ring's forward reads varlen calls in place (``varlen``)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block: Block,
                scale: float) -> tuple[torch.Tensor, torch.Tensor]: ...

    def backward(self, dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 out: torch.Tensor, lse: torch.Tensor, block: Block,
                 scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]: ...

    def forward_varlen(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, call,
                       scale: float) -> tuple[torch.Tensor, torch.Tensor]: ...

    def backward_varlen(self, dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                        v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor, call,
                        scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]: ...


def _sequences(call):
    """(query slice, key slice, the block as a local block) of each packed sequence; the
    block is None for a sequence without queries or without keys (``device_calls``)."""
    for i, blk in enumerate(call.sequence_blocks()):
        yield (slice(call.cu_q[i], call.cu_q[i + 1]), slice(call.cu_k[i], call.cu_k[i + 1]),
               blk)


class VarlenByLoop:
    """The varlen form by one dense call per packed sequence (CPU, and any fallback). A
    sequence with no keys gives zeros and lse -inf; one with no queries, zero gradients."""

    dense_min_area = float("inf")  # no faster varlen kernel here: pack everything
    gpu_bound_min_area = None  # the same for every pass
    # Whether the ring's forward calls ``forward_varlen_in_place`` where a call has the form
    # (``varlen.InPlaceBounds``): off for the loop, whose packed form copies per sequence
    # anyway; a test turns it on to check the ring's in-place offsets on CPU ranks.
    varlen_in_place = False

    def forward_varlen_in_place(self, q, k, v, call, scale):
        """The forward of ``call`` in its in-place form (``call.in_place``) by a loop: each
        sequence on its own rows of the whole Q, K and V; rows of no keys give zeros and
        lse +inf, as the flash kernel leaves them. out [rows of Q, h, dv], lse [h, rows]."""
        bounds = call.in_place
        out = q.new_zeros((q.shape[0], q.shape[1], v.shape[2]))
        lse = torch.full((q.shape[1], q.shape[0]), float("inf"),
                         dtype=working_dtype(q.dtype), device=q.device)
        for i, b in enumerate(bounds.block_of):
            if b < 0:
                continue
            blk = call.blocks[b]
            qs = slice(bounds.cu_q[i], bounds.cu_q[i + 1])
            ks = slice(bounds.cu_k[i], bounds.cu_k[i] + bounds.seqused_k[i])
            local = Block(0, qs.stop - qs.start, 0, ks.stop - ks.start, blk.kind, blk.lo,
                          blk.hi)
            o, block_lse = self.forward(q[None, qs], k[None, ks], v[None, ks], local, scale)
            out[qs], lse[:, qs] = o[0], block_lse[0]
        return out, lse

    def forward_varlen(self, q, k, v, call, scale):
        outs, lses = [], []
        for qs, ks, blk in _sequences(call):
            if blk is None:
                n = qs.stop - qs.start
                outs.append(q.new_zeros((n, q.shape[1], v.shape[2])))
                lses.append(torch.full((q.shape[1], n), float("-inf"),
                                       dtype=working_dtype(q.dtype), device=q.device))
                continue
            o, lse = self.forward(q[None, qs], k[None, ks], v[None, ks], blk, scale)
            outs.append(o[0])
            lses.append(lse[0])
        return torch.cat(outs), torch.cat(lses, dim=1)

    def backward_varlen(self, dout, q, k, v, out, lse, call, scale):
        grads = [self.backward(dout[None, qs], q[None, qs], k[None, ks], v[None, ks],
                               out[None, qs], lse[None, :, qs], blk, scale)
                 if blk is not None else
                 (torch.zeros_like(q[None, qs]), torch.zeros_like(k[None, ks]),
                  torch.zeros_like(v[None, ks]))
                 for qs, ks, blk in _sequences(call)]
        return tuple(torch.cat([g[i][0] for g in grads]) for i in range(3))


def _heads(t: torch.Tensor) -> torch.Tensor:
    """bshd view -> bhsd view (no copy)."""
    return t.transpose(1, 2)


def surrogate_out(dout: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
    """A tensor O' with rowsum(dout * O') == delta, built locally from dout and delta.

    Flash-style backward kernels read O only to form delta = rowsum(dO * O). The burst
    backward ships delta (hq fp32 scalars per token) instead of O (hq*d elements), and
    rebuilds an O' with the same row sums: O' = dO * delta / |dO|^2. Every term of the
    kernel's sum dO_i * O'_i has the same sign, so the rebuilt delta has no cancellation
    error, and |O'| <= |O| by Cauchy-Schwarz, so it cannot overflow. Rows with dO = 0 give
    O' = 0, which is exact when their delta is 0 too (``burst._backward_with_lse`` carries
    the rest). O' does not change when dO (and so delta) is scaled: the squared norm and the
    coefficient are computed in float64, with no floor, so the gradients stay linear in dO
    from tiny scales to huge ones (a fp32 |dO|^2 underflows below 1e-19 per element).
    dout: [b, s, h, d]; delta: [b, h, s] fp32 (fp64 for fp64 inputs).
    """
    norm2 = torch.linalg.vector_norm(dout, dim=-1, dtype=torch.float64).square_()
    coef = torch.where(norm2 > 0, delta.transpose(1, 2).double() / norm2,
                       torch.zeros_like(norm2)).to(delta.dtype)
    # The product is computed in delta's precision and rounded once as it is written.
    return torch.mul(dout, coef.unsqueeze(-1), out=torch.empty_like(dout))
