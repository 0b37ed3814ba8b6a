"""Megatron-Core adapter: BurstAttention as a context-parallel core-attention backend.

`attention` holds the core-attention module, `layout` the policy that gives each layer its
`CPLayout`, `spec` the BackendSpecProvider and layer specs, `arguments` the extra command-line
options, `norms` a sequence-parallel torch norm; `pretrain_gpt` is the training entry point
(`python -m megatron_burst.megatron.pretrain_gpt`).
"""
from megatron_burst.megatron.attention import BurstDotProductAttention
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
]
