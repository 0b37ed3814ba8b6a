"""The kernels that run anywhere: a plain PyTorch reference and PyTorch's CPU flash kernel.

Why apart: they need no GPU. The reference materialises the scores, so it is the yardstick
of the tests and of the CUDA probes (``selection.py``) and the last resort; the CPU flash
kernel is what CPU runs use. Neither has band support of its own: ``visible`` builds the
mask they apply.
"""
from __future__ import annotations

import torch

from ..plan.schedule import Block
from .protocol import FLOATS, Capabilities, VarlenByLoop, _heads, working_dtype


def visible(block: Block, device: torch.device) -> torch.Tensor:
    """[n, m] bool: which (query, key) pairs of a 'causal' or 'band' block are visible.

    O(n*m) for one block: used by the CPU and reference kernels, which have no band
    support of their own, and never by the CUDA fast paths.
    """
    n, m = block.q_stop - block.q_start, block.k_stop - block.k_start
    lo, hi = (-(n - 1), 0) if block.kind == "causal" else (block.lo, block.hi)
    diff = torch.arange(m, device=device)[None, :] - torch.arange(n, device=device)[:, None]
    return (diff >= lo) & (diff <= hi)


class ReferenceAttention(VarlenByLoop):
    """Plain PyTorch: materialises the block's scores. For tests and tiny shapes only."""

    name = "reference"
    capabilities = Capabilities(devices=frozenset({"cpu", "cuda"}), dtypes=FLOATS,
                                other_v_dim=True)

    def _probs(self, q, k, block, scale):
        hq, hkv = q.shape[2], k.shape[2]
        kk = k.repeat_interleave(hq // hkv, dim=2) if hq != hkv else k
        s = torch.einsum("bqhd,bkhd->bhqk", q, kk) * scale
        if block.kind != "full":
            s = s.masked_fill(~visible(block, s.device), float("-inf"))
        return s

    def forward(self, q, k, v, block, scale):
        hq, hkv = q.shape[2], k.shape[2]
        vv = v.repeat_interleave(hq // hkv, dim=2) if hq != hkv else v
        work = working_dtype(q.dtype)
        s = self._probs(q.to(work), k.to(work), block, scale)
        lse = torch.logsumexp(s, dim=-1)
        p = torch.exp(s - lse.masked_fill(torch.isinf(lse), 0).unsqueeze(-1))
        out = torch.einsum("bhqk,bkhd->bqhd", p, vv.to(work))
        return out.to(q.dtype), lse

    def backward(self, dout, q, k, v, out, lse, block, scale):
        hq, hkv = q.shape[2], k.shape[2]
        g = hq // hkv
        work = working_dtype(q.dtype)
        q_, k_, v_, do_ = (t.to(work) for t in (q, k, v, dout))
        vv = v_.repeat_interleave(g, dim=2) if g > 1 else v_
        kk = k_.repeat_interleave(g, dim=2) if g > 1 else k_
        s = self._probs(q_, k_, block, scale)
        p = torch.exp(s - lse.to(work).unsqueeze(-1))
        delta = (do_ * out.to(work)).sum(-1).transpose(1, 2)  # [b, h, q]
        dv = torch.einsum("bhqk,bqhd->bkhd", p, do_)
        dp = torch.einsum("bqhd,bkhd->bhqk", do_, vv)
        ds = p * (dp - delta.unsqueeze(-1)) * scale
        dq = torch.einsum("bhqk,bkhd->bqhd", ds, kk)
        dk = torch.einsum("bhqk,bqhd->bkhd", ds, q_)
        if g > 1:
            b, m = dk.shape[:2]
            dk = dk.view(b, m, hkv, g, -1).sum(3)
            dv = dv.view(b, m, hkv, g, -1).sum(3)
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


class CpuFlashAttention(VarlenByLoop):
    """PyTorch's CPU flash kernel (``_scaled_dot_product_flash_attention_for_cpu``).

    It handles GQA natively. For a row with no visible key it returns out = 0 and lse = 0
    (not -inf); the schedule trims every block so no row is empty, and the merge treats
    only lse = -inf as "nothing seen".
    """

    name = "cpu-flash"
    capabilities = Capabilities(devices=frozenset({"cpu"}), dtypes=FLOATS)

    @staticmethod
    def _bias(block, q):
        """Band blocks become an additive mask (the op has no window support)."""
        if block.kind != "band":
            return None
        keep = visible(block, q.device)
        return torch.zeros(keep.shape, dtype=q.dtype, device=q.device).masked_fill_(
            ~keep, float("-inf"))

    def native(self, q, k, v, block, scale):
        """The output alone, differentiable by aten's own backward (see cuda.CudnnAttention)."""
        return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            _heads(q), _heads(k), _heads(v), 0.0, block.causal,
            attn_mask=self._bias(block, q), scale=scale)[0].transpose(1, 2)

    def forward(self, q, k, v, block, scale):
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            _heads(q), _heads(k), _heads(v), 0.0, block.causal,
            attn_mask=self._bias(block, q), scale=scale)
        return out.transpose(1, 2), lse.to(working_dtype(q.dtype))

    def backward(self, dout, q, k, v, out, lse, block, scale):
        # The op takes lse in the dtype it produces: fp32 for fp32/bf16, fp64 for fp64.
        lse = lse.to(working_dtype(q.dtype))
        dq, dk, dv = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
            _heads(dout), _heads(q), _heads(k), _heads(v), _heads(out), lse, 0.0,
            block.causal, attn_mask=self._bias(block, q), scale=scale)
        return dq.transpose(1, 2), dk.transpose(1, 2), dv.transpose(1, 2)
