"""Local attention kernels behind one small protocol (BurstAttention's LAO).

One module per job:

- ``protocol``: what every backend computes (``LocalAttention``), the varlen form by a loop
  of dense calls (``VarlenByLoop``), and ``surrogate_out`` for the backward;
- ``reference``: the kernels that run anywhere (``ReferenceAttention``, ``CpuFlashAttention``);
- ``cuda``: cuDNN, PyTorch's flash and the ``flash_attn`` package;
- ``selection``: which of them runs, checked against a call's blocks (``select_kernel``,
  ``BandDispatch``, ``KERNELS``);
- ``merge``: the online-softmax merge of partial results (``merge_partial``);
- ``varlen``: a ring step's blocks as few varlen calls; ``pack_calls``: a document pack's
  calls for one pair of ring members, made from arrays.

Backends: ``flash_attn`` (the package, when importable), PyTorch's built-in CUDA kernels
(cuDNN, then flash: each is probed once and skipped if it fails; band blocks go to
flash, which takes windows), the CPU flash kernel, and a plain PyTorch reference used by
the tests and as the last resort.

The names below are re-exported so that ``from megatron_burst.kernels import X`` and
``kernels.X`` keep working.
"""
from __future__ import annotations

from .cuda import CudnnAttention, FlashAttnPackage, TorchFlashAttention
from .protocol import Capabilities, LocalAttention, VarlenByLoop, surrogate_out, working_dtype
from .reference import CpuFlashAttention, ReferenceAttention, visible
from .selection import (KERNEL_NAMES, KERNELS, VARLEN_DENSE_MIN_AREA, BandDispatch,
                        default_scale, select_kernel)

__all__ = [
    "BandDispatch", "Capabilities", "CpuFlashAttention", "CudnnAttention", "FlashAttnPackage",
    "KERNELS", "KERNEL_NAMES", "LocalAttention", "ReferenceAttention", "TorchFlashAttention",
    "VARLEN_DENSE_MIN_AREA", "VarlenByLoop", "default_scale", "select_kernel",
    "surrogate_out", "visible", "working_dtype",
]
