"""What the GPU's fused kernels take, without torch: the head dims PyTorch's flash and cuDNN
SDPA kernels and the ``flash_attn`` package run (``cuda``'s capabilities are made of these).

Apart from ``cuda`` so that what only checks a shape (``launch``'s plan, which runs without
torch) reads the kernels' own numbers instead of a copy of them.
"""
from __future__ import annotations

FUSED_HEAD_DIM_MULTIPLE = 8  # a head dim the fused kernels take is a multiple of this
FUSED_MAX_HEAD_DIM = 256  # and at most this


def fused_head_dim_ok(head_dim: int) -> bool:
    """Whether the GPU's fused kernels run heads of ``head_dim``."""
    return head_dim % FUSED_HEAD_DIM_MULTIPLE == 0 and head_dim <= FUSED_MAX_HEAD_DIM
