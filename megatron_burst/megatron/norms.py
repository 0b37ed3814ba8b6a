"""A PyTorch norm that works under Megatron's sequence parallelism without TE or apex.

Megatron-Core's fallback norm, `WrappedTorchNorm`, asserts `sequence_parallel` is off. Nothing
in the norm's math depends on it: with sequence parallelism each TP rank normalises its own
slice of the sequence, and the only extra duty is that the weight's gradient (a partial sum
over that slice) be summed over the TP group. Megatron's `finalize_model_grads` does that for
every parameter tagged `sequence_parallel = True`, which is what TE's and apex's norms do and
what `SequenceParallelTorchNorm` does. So a Megatron run on a host without TE or apex (the lent
GPU machines, a CPU laptop) can use TP + SP, the usual baseline next to context parallelism.
"""
from __future__ import annotations

from typing import Any

import torch

_NORMS = {"LayerNorm": torch.nn.LayerNorm, "RMSNorm": torch.nn.RMSNorm}


class SequenceParallelTorchNorm:
    """Builder with Megatron's norm signature: `torch.nn.LayerNorm` or `torch.nn.RMSNorm`
    whose parameters carry `sequence_parallel = config.sequence_parallel`."""

    def __new__(
        cls, config: Any, hidden_size: int, eps: float = 1e-5, **unused: Any
    ) -> torch.nn.Module:
        # persist_layer_norm / memory_efficient_layer_norm are kernel choices of apex and TE
        # (same math); zero-centred gamma is different math and is refused.
        if getattr(config, "layernorm_zero_centered_gamma", False):
            raise ValueError(
                "SequenceParallelTorchNorm: config.layernorm_zero_centered_gamma=True needs "
                "TransformerEngine's or apex's norm"
            )
        norm_cls = _NORMS.get(config.normalization)
        if norm_cls is None:
            raise ValueError(
                f"SequenceParallelTorchNorm: config.normalization must be one of "
                f"{sorted(_NORMS)}, got {config.normalization!r}"
            )
        norm = norm_cls(hidden_size, eps=eps)
        for param in norm.parameters():
            setattr(param, "sequence_parallel", bool(config.sequence_parallel))
        return norm
