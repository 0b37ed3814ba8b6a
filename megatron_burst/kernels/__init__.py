"""Local attention kernels behind one small protocol (BurstAttention's LAO).

One module per job:

- ``protocol``: what every backend computes (``LocalAttention``), the varlen form by a loop
  of dense calls (``VarlenByLoop``), and ``surrogate_out`` for the backward;
- ``reference``: the kernels that run anywhere (``ReferenceAttention``, ``CpuFlashAttention``);
- ``cuda``: cuDNN, PyTorch's flash and the ``flash_attn`` package;
- ``flex``: FlexAttention for the forward of large band blocks (windows), on CUDA;
- ``selection``: which of them runs, checked against a call's blocks (``select_kernel``,
  ``BandDispatch``, ``KERNELS``);
- ``merge``: the online-softmax merge of partial results (``merge_partial``);
- ``varlen``: a ring step's blocks as few varlen calls; ``pack_calls``: a document pack's
  calls for one pair of ring members, made from arrays;
- ``run_calls``: a step's calls run and their results folded into the accumulators.

Backends: ``flash_attn`` (the package, when importable), PyTorch's built-in CUDA kernels
(cuDNN, then flash: each is probed once and skipped if it fails; band blocks go to
flash, which takes windows), the CPU flash kernel, and a plain PyTorch reference used by
the tests and as the last resort.

The names below are re-exported so that ``from megatron_burst.kernels import X`` and
``kernels.X`` keep working; each is imported when first asked for (``limits`` needs no torch).
"""
from __future__ import annotations

import importlib
from typing import Any

# Where each re-exported name lives: imported on first use (PEP 562), so that importing a
# torch-free module of this package (``kernels.limits``) loads no torch.
_HOMES = {
    "CudnnAttention": "cuda", "FlashAttnPackage": "cuda", "TorchFlashAttention": "cuda",
    "Capabilities": "protocol", "LocalAttention": "protocol", "VarlenByLoop": "protocol",
    "surrogate_out": "protocol", "working_dtype": "protocol",
    "CpuFlashAttention": "reference", "ReferenceAttention": "reference", "visible": "reference",
    "KERNEL_NAMES": "selection", "KERNELS": "selection", "VARLEN_DENSE_MIN_AREA": "thresholds",
    "BandDispatch": "selection", "default_scale": "selection", "select_kernel": "selection",
}
__all__ = sorted(_HOMES)


def __getattr__(name: str) -> Any:
    if name in _HOMES:
        value = getattr(importlib.import_module(f".{_HOMES[name]}", __name__), name)
        globals()[name] = value
        return value
    try:  # a submodule read as an attribute (``kernels.selection``)
        return importlib.import_module(f".{name}", __name__)
    except ModuleNotFoundError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_HOMES))
