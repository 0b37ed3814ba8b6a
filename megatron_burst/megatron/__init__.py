"""Megatron-Core adapter: BurstAttention as a context-parallel core-attention backend.

`attention` holds the core-attention module (`masks`: what it reads from Megatron's mask
arguments; `softmax_offset`: the sinks it holds), `resolve` reads a run's CP topology from
Megatron's settings (`machine_profile`: 'auto' from this machine's measured profile),
`spec` the BackendSpecProvider and layer specs (which hand the topology to every layer),
`arguments` the extra command-line options, `norms` a sequence-parallel torch norm.
`pretrain_gpt` is the training entry point (`python -m megatron_burst.megatron.pretrain_gpt`),
with `loss` (the token loss and Megatron's loss checks) and `model_parts` (each model chunk's
layer spec and virtual stage); `entry` is what it and Megatron-LM's
patched pretrain_gpt.py call: the run's choices (`burst_run`), the refusals (`run_checks`,
with `resume` deciding what a run resumes), the document micro-batches (`run_batches`), the
FLOPs (`run_flops`) and the rank-0 printer (`printer`). Packed documents: `documents`
(how a batch says where they are), `document_model` (RoPE restarted per document),
`document_batches` (a micro-batch made off the step), `prefetch` (made on a background
thread), `batch_verdict` (every rank's batch made), `pack_plans` (a pack's ring plans made
ahead); `mask_batches` (--burst-mask-builder: a slice mask per micro-batch, sharded by
mask area), `mask_batch_maker` (such a micro-batch made off the step, its plans ahead);
`trace` profiles a few micro-batches. `environment` says what the installed
megatron-core (and Megatron-LM) can run, for this layer and the launch layer above it.
"""
from megatron_burst.comm.lazy import lazy_names

# Imported on first use: the launch layer reads `environment` here without megatron-core or
# torch, which the module and the spec import.
_LAZY = {"BurstDotProductAttention": ".attention", "BurstSpecProvider": ".spec",
         "get_gpt_layer_burst_spec": ".spec", "get_llama_layer_burst_spec": ".spec"}
__all__ = sorted(_LAZY)
__getattr__, __dir__ = lazy_names(__name__, _LAZY)
