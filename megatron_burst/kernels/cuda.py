"""The CUDA kernels: cuDNN and flash as built into PyTorch, and the ``flash_attn`` package.

Why apart: each wraps a private op whose signature moves between versions, and none can be
tried without a GPU; ``selection.py`` probes each once and skips one that fails. cuDNN is
the fastest dense kernel; flash takes windows, so band blocks go to it, and it does the
varlen form in one launch. K/V with fewer heads are expanded where a kernel needs it.
"""
from __future__ import annotations

import torch

from .limits import FUSED_HEAD_DIM_MULTIPLE, FUSED_MAX_HEAD_DIM
from .protocol import HALF, Capabilities, VarlenByLoop, _heads

# What PyTorch's and flash-attn's fused kernels take (the probe in selection.py checks the
# rest on the GPU at hand).
_FUSED = dict(devices=frozenset({"cuda"}), dtypes=HALF, max_head_dim=FUSED_MAX_HEAD_DIM,
              head_dim_multiple=FUSED_HEAD_DIM_MULTIPLE)


class CudnnAttention(VarlenByLoop):
    """cuDNN fused attention through PyTorch (fastest on Hopper: the "single-gpu kernel" rows
    of benchmarks/results/h200x1_attention.md).

    K/V with fewer heads than Q go to cuDNN as they are (it takes GQA, forward and
    backward, as PyTorch's SDPA hands it them): no expanded copies, no folded gradients.
    ``expand_kv``: expand them first, for a cuDNN that does not (the automatic choice tries
    this only where the native form fails its probe in ``selection``)."""

    name = "cudnn"

    def __init__(self, expand_kv: bool = False):
        self.expand_kv = expand_kv
    # cuDNN's masks here are none and top-left causal: no windows; it refuses a block of
    # one query against one key (tiny padded documents).
    capabilities = Capabilities(kinds=frozenset({"full", "causal"}), min_side=2,
                                other_v_dim=True, **_FUSED)

    def native(self, q, k, v, block, scale):
        """The output alone, differentiable by aten's own backward (no lse, no Python in the
        backward): the whole attention of a single rank when nothing needs its lse."""
        if self.expand_kv:
            return self.forward(q, k, v, block, scale)[0]  # (not differentiable: no native)
        # cuDNN's backward reads the forward's logsumexp: without it (compute_log_sumexp
        # False) the op still returns a gradient, a wrong one. SDPA asks for it whenever an
        # input needs a gradient; so does this.
        grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad
                                            or v.requires_grad)
        return torch.ops.aten._scaled_dot_product_cudnn_attention(
            _heads(q), _heads(k), _heads(v), None, grad, 0.0, block.causal, False,
            scale=scale)[0].transpose(1, 2)

    def forward(self, q, k, v, block, scale):
        if self.expand_kv:
            k, v = _expand_kv(k, q.shape[2]), _expand_kv(v, q.shape[2])
        q, k, v = _batch_strided(q), _batch_strided(k), _batch_strided(v)
        out, lse = torch.ops.aten._scaled_dot_product_cudnn_attention(
            _heads(q), _heads(k), _heads(v), None, True, 0.0, block.causal, False,
            scale=scale)[:2]
        if lse.dim() == 4:
            lse = lse.squeeze(-1)
        return out.transpose(1, 2), lse.float()

    def backward(self, dout, q, k, v, out, lse, block, scale):
        hkv = k.shape[2]
        if self.expand_kv:
            k, v = _expand_kv(k, q.shape[2]), _expand_kv(v, q.shape[2])
        empty = torch.empty(0, device=q.device)
        dout, q, k, v, out = (_batch_strided(t) for t in (dout, q, k, v, out))
        dq, dk, dv = torch.ops.aten._scaled_dot_product_cudnn_attention_backward(
            _heads(dout), _heads(q), _heads(k), _heads(v), _heads(out),
            lse.unsqueeze(-1).contiguous(), empty, empty, None, None, None,
            q.shape[1], k.shape[1], 0.0, block.causal, scale=scale)
        dk, dv = dk.transpose(1, 2), dv.transpose(1, 2)
        if self.expand_kv:
            dk, dv = _fold_kv_grad(dk, hkv), _fold_kv_grad(dv, hkv)
        return dq.transpose(1, 2), dk, dv


def _batch_strided(t: torch.Tensor) -> torch.Tensor:
    """A batch of one as a view whose batch stride follows from its own rows (the stride is
    never read for one batch). PyTorch keys cuDNN's graphs by the tensors' strides too: a
    block cut from a ring's K/V buffer, whose length follows the mask, would otherwise be a
    new graph for every new pack (``thresholds.SHAPE_FREE_GRAIN``)."""
    if t.shape[0] != 1 or t.stride(0) == t.shape[1] * t.stride(1):
        return t
    return t.as_strided(t.shape, (t.shape[1] * t.stride(1), *t.stride()[1:]),
                        t.storage_offset())


def _expand_kv(t: torch.Tensor, hq: int) -> torch.Tensor:
    hkv = t.shape[2]
    return t if hkv == hq else t.repeat_interleave(hq // hkv, dim=2)


def _fold_kv_grad(g: torch.Tensor, hkv: int) -> torch.Tensor:
    b, s, hq, d = g.shape
    return g if hq == hkv else g.view(b, s, hkv, hq // hkv, d).sum(3)


class TorchFlashAttention(VarlenByLoop):
    """FlashAttention-2 as built into PyTorch (bshd-native, GQA-native)."""

    name = "torch-flash"
    capabilities = Capabilities(one_launch_varlen=True, **_FUSED)
    in_place_launch = True  # its in-place varlen forward is one launch (seqused_k)

    @staticmethod
    def _window(block):
        return block.flash_window if block.kind == "band" else (None, None)

    def native(self, q, k, v, block, scale):
        """The output alone, differentiable by aten's own backward (see CudnnAttention)."""
        left, right = self._window(block)
        return torch.ops.aten._flash_attention_forward(
            q, k, v, None, None, q.shape[1], k.shape[1], 0.0, block.causal, False, scale=scale,
            window_size_left=left, window_size_right=right)[0]

    def forward(self, q, k, v, block, scale):
        left, right = self._window(block)
        out, lse, *_ = torch.ops.aten._flash_attention_forward(
            q, k, v, None, None, q.shape[1], k.shape[1], 0.0, block.causal, False, scale=scale,
            window_size_left=left, window_size_right=right)
        return out, lse.float()

    def backward(self, dout, q, k, v, out, lse, block, scale):
        left, right = self._window(block)
        # The kernel reads lse as a dense [b, h, s]; the ring hands a slice of the rows.
        dq, dk, dv = torch.ops.aten._flash_attention_backward(
            dout, q, k, v, out, lse.contiguous(), None, None, q.shape[1], k.shape[1], 0.0,
            block.causal,
            torch.empty(2, dtype=torch.int64, device=q.device),
            torch.empty(0, device=q.device), scale=scale, window_size_left=left,
            window_size_right=right)
        return dq, dk, dv

    @staticmethod
    def _varlen_window(call):
        return (None, None) if call.causal or call.window == (-1, -1) else call.window

    def forward_varlen(self, q, k, v, call, scale):
        cu_q, cu_k = call.cu_tensors(q.device)
        left, right = self._varlen_window(call)
        out, lse, *_ = torch.ops.aten._flash_attention_forward(
            q, k, v, cu_q, cu_k, call.max_q, call.max_k, 0.0, call.causal, False, scale=scale,
            window_size_left=left, window_size_right=right)
        return out, lse.float()

    def forward_varlen_in_place(self, q, k, v, call, scale):
        """``forward_varlen`` on the whole Q, K and V (``varlen.InPlaceBounds``): each
        sequence reads its keys from its own start (``seqused_k``), nothing is gathered.
        Only the forward: aten's varlen backward takes no ``seqused_k``."""
        cu_q, cu_k, used = call.in_place_tensors(q.device)
        bounds = call.in_place
        left, right = self._varlen_window(call)
        out, lse, *_ = torch.ops.aten._flash_attention_forward(
            q, k, v, cu_q, cu_k, bounds.max_q, bounds.max_k, 0.0, call.causal, False,
            scale=scale, window_size_left=left, window_size_right=right, seqused_k=used)
        return out, lse.float()

    def backward_varlen(self, dout, q, k, v, out, lse, call, scale):
        cu_q, cu_k = call.cu_tensors(q.device)
        left, right = self._varlen_window(call)
        dq, dk, dv = torch.ops.aten._flash_attention_backward(
            dout, q, k, v, out, lse.contiguous(), cu_q, cu_k, call.max_q, call.max_k, 0.0,
            call.causal, torch.empty(2, dtype=torch.int64, device=q.device),
            torch.empty(0, device=q.device), scale=scale, window_size_left=left,
            window_size_right=right)
        return dq, dk, dv


class FlashAttnPackage(VarlenByLoop):
    """The ``flash_attn`` package (Dao-AILab), preferred on CUDA when installed."""

    name = "flash-attn"
    capabilities = Capabilities(one_launch_varlen=True, **_FUSED)

    def __init__(self):
        from flash_attn import flash_attn_interface as fai  # noqa: F401
        self._fai = fai

    @staticmethod
    def _window(block):
        return (-1, -1) if block.kind != "band" else block.flash_window

    def forward(self, q, k, v, block, scale):
        left, right = self._window(block)
        res = self._fai._flash_attn_forward(q, k, v, 0.0, scale, causal=block.causal,
                                            window_size_left=left, window_size_right=right,
                                            softcap=0.0, alibi_slopes=None,
                                            return_softmax=False)
        return res[0], res[1].float()

    def backward(self, dout, q, k, v, out, lse, block, scale):
        left, right = self._window(block)
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        self._fai._flash_attn_backward(dout, q, k, v, out, lse.contiguous(), dq, dk, dv, 0.0,
                                       scale, block.causal, left, right, 0.0, None, False)
        return dq, dk, dv

    # flash-attn 2.x's varlen entry points; a version whose signature differs fails the
    # probe in ``selection._probe_varlen`` and the package is then not used for varlen calls.
    def forward_varlen(self, q, k, v, call, scale):
        cu_q, cu_k = call.cu_tensors(q.device)
        left, right = (-1, 0) if call.causal else call.window
        res = self._fai._flash_attn_varlen_forward(
            q, k, v, cu_q, cu_k, call.max_q, call.max_k, 0.0, scale, call.causal,
            window_size_left=left, window_size_right=right, softcap=0.0, alibi_slopes=None,
            return_softmax=False)
        return res[0], res[1].float()

    def backward_varlen(self, dout, q, k, v, out, lse, call, scale):
        cu_q, cu_k = call.cu_tensors(q.device)
        left, right = (-1, 0) if call.causal else call.window
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        self._fai._flash_attn_varlen_backward(
            dout, q, k, v, out, lse.contiguous(), dq, dk, dv, cu_q, cu_k, call.max_q,
            call.max_k, 0.0, scale, call.causal, left, right, 0.0, None, False)
        return dq, dk, dv

