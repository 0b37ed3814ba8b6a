"""The local attention protocol (BurstAttention's LAO): what every kernel computes.

Why apart: the ring (``burst.py``, ``varlen.py``) calls kernels only through this contract,
so a backend is added or chosen (``selection.py``) without the ring knowing which runs.
Every backend computes attention for one ``Block`` of the ring schedule:

    forward(q, k, v, block, scale)  -> (out, lse)
    backward(dout, q, k, v, out, lse, block, scale) -> (dq, dk, dv)

and for many blocks at once, packed back to back (``varlen.KernelCall``; tensors
[total, h, d], lse [h, total]):

    forward_varlen(q, k, v, call, scale) -> (out, lse)
    backward_varlen(dout, q, k, v, out, lse, call, scale) -> (dq, dk, dv)

PyTorch's flash kernel (and flash-attn's) do the varlen form in one launch; every other
backend does it by a loop of its own dense calls (``VarlenByLoop``), which is also how the
CPU tests exercise the packing. ``dense_min_area`` tells ``varlen.plan_calls`` from which
block size a dense call beats the varlen kernel.

Tensors are ``[b, s, h, d]`` views (bshd; sbhd inputs arrive as strided views, never
copied). K/V may have fewer heads than Q (GQA/MQA). ``lse`` is fp32 ``[b, hq, s]``.
``backward`` receives the *final* (merged) ``out`` and ``lse`` of the whole ring, so each
block's gradients are exact pieces of the global gradient. It uses ``out`` only for the
row sums ``delta = rowsum(dout * out)``, which is what lets the burst backward send delta
instead of O (see ``surrogate_out``).
"""
from __future__ import annotations

from typing import Protocol

import torch

from ..schedule import Block


class LocalAttention(Protocol):
    name: str
    dense_min_area: float

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
    """(query slice, key slice, the block as a local block) of each packed sequence."""
    for i, blk in enumerate(call.blocks):
        n, m = blk.q_stop - blk.q_start, blk.k_stop - blk.k_start
        yield (slice(call.cu_q[i], call.cu_q[i + 1]), slice(call.cu_k[i], call.cu_k[i + 1]),
               Block(0, n, 0, m, blk.kind, blk.lo, blk.hi))


class VarlenByLoop:
    """The varlen form by one dense call per packed sequence (CPU, and any fallback)."""

    dense_min_area = float("inf")  # no faster varlen kernel here: pack everything

    def forward_varlen(self, q, k, v, call, scale):
        outs, lses = [], []
        for qs, ks, blk in _sequences(call):
            o, lse = self.forward(q[None, qs], k[None, ks], v[None, ks], blk, scale)
            outs.append(o[0])
            lses.append(lse[0])
        return torch.cat(outs), torch.cat(lses, dim=1)

    def backward_varlen(self, dout, q, k, v, out, lse, call, scale):
        grads = [self.backward(dout[None, qs], q[None, qs], k[None, ks], v[None, ks],
                               out[None, qs], lse[None, :, qs], blk, scale)
                 for qs, ks, blk in _sequences(call)]
        return tuple(torch.cat([g[i][0] for g in grads]) for i in range(3))


def _lse_dtype(lse: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """lse is fp32, or fp64 for fp64 inputs."""
    return lse.to(torch.float64 if q.dtype == torch.float64 else torch.float32)


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
    O' = 0, which is exact (their delta is 0 too).
    dout: [b, s, h, d]; delta: [b, h, s] fp32.
    """
    # Two passes over dout and no fp32 copy of it: the norm reduces in fp32 as it reads,
    # and the product is computed in fp32 and rounded once as it is written.
    norm2 = torch.linalg.vector_norm(dout, dim=-1, dtype=delta.dtype).square_()
    coef = torch.where(norm2 > 0, delta.transpose(1, 2) / norm2.clamp_min(1e-30),
                       torch.zeros_like(norm2))
    return torch.mul(dout, coef.unsqueeze(-1), out=torch.empty_like(dout))
