"""Megatron's softmax types on BurstAttention: the sinks as the layer holds them.

Megatron-Core's `TransformerConfig.softmax_type` adds a per-head logit to every row's softmax
(`megatron_burst.attention.sinks`): "vanilla" none, "off-by-one" a fixed zero, "learnable" a trained
parameter (gpt-oss's attention sinks). The layer holds them as Megatron's own
`DotProductAttention` does, so checkpoints interchange: a tensor `softmax_offset` of the
heads of this tensor-parallel rank, a `torch.nn.Parameter` when learnable (initialised
with `config.init_method`, sharded by heads over TP in the distributed checkpoint, and
marked tensor-parallel so gradient norms count every rank's heads), a plain tensor of
zeros for off-by-one. The parameter is replicated over the CP group; each CP rank's
gradient covers its own rows and Megatron's data-parallel reduction (DP x CP) sums them.
"""
from __future__ import annotations

from typing import Any, Optional

import torch
from megatron.core.tensor_parallel import set_tensor_model_parallel_attributes

SOFTMAX_TYPES = ("vanilla", "off-by-one", "learnable")


def make_softmax_offset(module: torch.nn.Module, config: Any, heads: int) -> None:
    """Give ``module`` its `softmax_offset` for ``config.softmax_type`` (None: vanilla)."""
    kind = getattr(config, "softmax_type", "vanilla")
    if kind not in SOFTMAX_TYPES:
        raise ValueError(f"softmax_type must be one of {SOFTMAX_TYPES}, got {kind!r}")
    if kind == "vanilla":
        module.softmax_offset = None
        return
    device = _device(config)
    dtype = getattr(config, "params_dtype", torch.float32)
    if kind == "off-by-one":
        module.softmax_offset = torch.zeros(heads, device=device, dtype=dtype)
        return
    offset = torch.nn.Parameter(torch.empty(heads, device=device, dtype=dtype))
    if getattr(config, "perform_initialization", True):
        config.init_method(offset.data)
    set_tensor_model_parallel_attributes(offset, is_parallel=True, dim=0, stride=1)
    module.register_parameter("softmax_offset", offset)


def _device(config: Any) -> torch.device:
    """Where the layer's other parameters are made."""
    if getattr(config, "use_cpu_initialization", False) or not torch.cuda.is_available():
        return torch.device("cpu")
    return torch.device("cuda", torch.cuda.current_device())


def sharded_offset(module: torch.nn.Module, prefix: str, sharded_offsets: tuple,
                   metadata: Optional[dict], tp_group: Any) -> dict:
    """The learnable offset in a distributed checkpoint: sharded by heads over TP."""
    from megatron.core.transformer.utils import make_sharded_tensors_for_checkpoint

    if not isinstance(module.softmax_offset, torch.nn.Parameter):
        return {}
    state = {"softmax_offset": module.softmax_offset}
    extra = {}
    if tp_group is not None:
        extra["tp_group"] = tp_group
    if metadata and metadata.get("dp_cp_group") is not None:
        extra["dp_cp_group"] = metadata["dp_cp_group"]
    return make_sharded_tensors_for_checkpoint(state, prefix, {"softmax_offset": 0},
                                               sharded_offsets, **extra)
