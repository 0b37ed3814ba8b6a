"""Megatron-Core adapter: BurstAttention as a context-parallel core-attention backend.

`attention` holds the core-attention module, `spec` the BackendSpecProvider and layer specs,
`arguments` the extra command-line options; `megatron_burst.pretrain_gpt` is the entry point.
"""
from megatron_burst.megatron.attention import BurstDotProductAttention, resolve_layout
from megatron_burst.megatron.spec import (
    BurstSpecProvider,
    get_gpt_layer_burst_spec,
    get_llama_layer_burst_spec,
)

__all__ = [
    "BurstDotProductAttention",
    "BurstSpecProvider",
    "get_gpt_layer_burst_spec",
    "get_llama_layer_burst_spec",
    "resolve_layout",
]
