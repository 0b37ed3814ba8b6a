"""Megatron-Core adapter: BurstAttention as a context-parallel core-attention backend.

`attention` holds the core-attention module, `resolve` reads a run's CP topology from
Megatron's settings, `spec` the BackendSpecProvider and layer specs (which hand the topology
to every layer), `arguments` the extra command-line options, `entry` what both ways into the
training loop share, `documents`/`document_model`/`masks` packed documents, `norms` a
sequence-parallel torch norm; `pretrain_gpt` is the training entry point
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
