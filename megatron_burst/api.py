"""``burst_attn``: the public entry point, and the argument checks that guard it.

Every check here uses only this rank's arguments and the group's size, so a bad call
raises ``ValueError`` on every rank before any byte is sent, instead of leaving the ranks
that passed waiting forever on the ones that failed.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from . import cost
from .burst import BurstAttentionFunction, RingSpec, resolve_backward
from .kernels import default_scale
from .layout import group_size_rank
from .schedule import LAYOUTS, chunks_per_rank

QKV_FORMATS = ("bshd", "sbhd")


def _validate(q, k, v, world, causal, softmax_scale, window_size, layout, backward,
              qkv_format, intra_node_size, ulysses_size, cu_seqlens) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{name} must be 4-D [{qkv_format[0]}, {qkv_format[1]}, heads, "
                             f"head_dim], got shape {tuple(t.shape)}")
        if not t.is_floating_point():
            raise ValueError(f"{name} must be a floating-point tensor, got {t.dtype}")
    if qkv_format not in QKV_FORMATS:
        raise ValueError(f"qkv_format must be one of {QKV_FORMATS}, got {qkv_format!r}")
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    if backward not in cost.BACKWARD_MODES:
        raise ValueError(f"backward must be one of {cost.BACKWARD_MODES}, got {backward!r}")
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise ValueError(f"q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if k.device != q.device or v.device != q.device:
        raise ValueError(f"q, k, v must be on one device, got {q.device}, {k.device}, "
                         f"{v.device}")
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape, got {tuple(k.shape)} and "
                         f"{tuple(v.shape)}")
    if q.shape[:2] != k.shape[:2]:
        raise ValueError(f"q and k must agree on batch and local sequence ({qkv_format}), got "
                         f"{tuple(q.shape)} and {tuple(k.shape)}")
    if q.shape[3] != k.shape[3]:
        raise ValueError(f"q and k must have the same head_dim, got {q.shape[3]} and "
                         f"{k.shape[3]}")
    hq, hkv = q.shape[2], k.shape[2]
    if hkv == 0 or hq % hkv:
        raise ValueError(f"the number of q heads ({hq}) must be a multiple of the number of "
                         f"k/v heads ({hkv})")
    s_local = q.shape[1] if qkv_format == "bshd" else q.shape[0]
    per_rank = chunks_per_rank(layout)
    if s_local == 0 or s_local % per_rank:
        raise ValueError(
            f"sequence length {s_local * world} (local {s_local} x {world} ranks) must be "
            f"divisible by {per_rank * world} for layout {layout!r}")
    if softmax_scale is not None and not (isinstance(softmax_scale, (int, float))
                                          and softmax_scale > 0):
        raise ValueError(f"softmax_scale must be a positive number or None, got "
                         f"{softmax_scale!r}")
    if (not isinstance(window_size, (tuple, list)) or len(window_size) != 2
            or not all(isinstance(w, int) and w >= -1 for w in window_size)):
        raise ValueError(f"window_size must be a pair of ints >= -1, got {window_size!r}")
    if tuple(window_size) != (-1, -1):
        raise ValueError("window_size: sliding windows are not supported yet; pass (-1, -1)")
    if intra_node_size not in (None, world):
        raise ValueError("intra_node_size: the double ring is not supported yet; pass None")
    if ulysses_size != 1:
        raise ValueError("ulysses_size: the Ulysses hybrid is not supported yet; pass 1")
    if cu_seqlens is not None:
        raise ValueError("cu_seqlens: packed documents are not supported yet; pass None")


def burst_attn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               group: dist.ProcessGroup | None = None, *, causal: bool = False,
               softmax_scale: float | None = None, window_size: tuple[int, int] = (-1, -1),
               layout: str = "zigzag", backward: str = "auto", qkv_format: str = "bshd",
               intra_node_size: int | None = None, ulysses_size: int = 1,
               cu_seqlens: torch.Tensor | None = None, return_lse: bool = False,
               kernel: str | None = None):
    """Exact attention over a sequence sharded across ``group`` (BurstAttention).

    q: [b, s_local, hq, d]; k, v: [b, s_local, hkv, d] (``qkv_format="sbhd"`` swaps the
    first two dims). Returns out (q's shape, dtype and layout), and with
    ``return_lse=True`` also lse [b, hq, s_local] fp32. Differentiable in q, k and v.
    ``kernel`` forces a local attention backend by name (see ``kernels.KERNELS``).
    """
    world, rank = group_size_rank(group)
    _validate(q, k, v, world, causal, softmax_scale, window_size, layout, backward,
              qkv_format, intra_node_size, ulysses_size, cu_seqlens)
    hq, hkv, d = q.shape[2], k.shape[2], q.shape[3]
    spec = RingSpec(
        group=group, world=world, rank=rank, layout=layout, causal=bool(causal),
        scale=float(softmax_scale) if softmax_scale is not None else default_scale(d),
        backward=resolve_backward(backward, world, hq, hkv, d, q.element_size()),
        seq_first=qkv_format == "sbhd", kernel=kernel)
    # NCCL and gloo send contiguous buffers; Megatron hands K/V as views of the fused QKV.
    k, v = k.contiguous(), v.contiguous()
    out, lse = BurstAttentionFunction.apply(q.contiguous(), k, v, spec)
    return (out, lse) if return_lse else out
