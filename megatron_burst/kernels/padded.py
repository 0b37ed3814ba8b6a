"""Q/K and V of different head dims (MLA) on a kernel that takes one head dim for all three.

DeepSeek-style multi-head latent attention gives Q and K heads of 192 dims (128 + 64 rotary)
and V heads of 128, and the output has V's dim. A kernel that wants equal dims (PyTorch's
flash, the CPU flash kernel) runs it with the smaller side zero-padded to the larger: zero
columns of V add zero columns to the output (and to its gradient's delta, dO . O, nothing);
zero columns of Q and K add nothing to the scores. The padding is cut off again from the
output and the gradients. The ring never sees it: K and V travel at their own sizes.
"""
from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F

from .protocol import LocalAttention, VarlenByLoop


def _pad(t: torch.Tensor, dim: int) -> torch.Tensor:
    return t if t.shape[-1] == dim else F.pad(t, (0, dim - t.shape[-1]))


class PaddedHeads(VarlenByLoop):
    """``inner`` run on Q/K and V padded to one head dim (see the module docstring)."""

    def __init__(self, inner: LocalAttention):
        self.inner = inner
        self.name = f"{inner.name} (heads padded)"
        self.dense_min_area = inner.dense_min_area
        self.gpu_bound_min_area = inner.gpu_bound_min_area
        self.capabilities = dataclasses.replace(inner.capabilities, other_v_dim=True)

    @staticmethod
    def _dims(q, v) -> tuple[int, int, int]:
        return q.shape[-1], v.shape[-1], max(q.shape[-1], v.shape[-1])

    def forward(self, q, k, v, block, scale):
        d, dv, m = self._dims(q, v)
        out, lse = self.inner.forward(_pad(q, m), _pad(k, m), _pad(v, m), block, scale)
        return out[..., :dv], lse

    def backward(self, dout, q, k, v, out, lse, block, scale):
        d, dv, m = self._dims(q, v)
        dq, dk, dvv = self.inner.backward(_pad(dout, m), _pad(q, m), _pad(k, m), _pad(v, m),
                                          _pad(out, m), lse, block, scale)
        return dq[..., :d], dk[..., :d], dvv[..., :dv]

    def forward_varlen(self, q, k, v, call, scale):
        d, dv, m = self._dims(q, v)
        out, lse = self.inner.forward_varlen(_pad(q, m), _pad(k, m), _pad(v, m), call, scale)
        return out[..., :dv], lse

    def backward_varlen(self, dout, q, k, v, out, lse, call, scale):
        d, dv, m = self._dims(q, v)
        dq, dk, dvv = self.inner.backward_varlen(_pad(dout, m), _pad(q, m), _pad(k, m),
                                                 _pad(v, m), _pad(out, m), lse, call, scale)
        return dq[..., :d], dk[..., :d], dvv[..., :dv]
