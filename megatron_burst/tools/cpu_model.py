"""The model side of the CPU run: megatron-core's GPTModel and one training step on gloo ranks.

`megatron-burst run` on a CPU host trains a config's model with megatron-core's own GPTModel,
the BurstAttention layer spec and Megatron's TP/CP/SP layers. Megatron's pipeline schedules
and training loop need CUDA, so this module holds the small replacements: a parallel-state
setup with CPU RNG states, a TransformerConfig for the run's shape, and `train_step`, which
runs one forward/backward on this pipeline stage (stages exchange activations with plain
send/recv) and the gradient reductions Megatron's DDP + finalize_model_grads do (average over
DP x CP, sequence-parallel norm grads summed over TP). Use it inside
`cpu_shims.megatron_on_cpu()`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional

import torch
import torch.distributed as dist
import torch.nn.functional as F


def cpu_model_parallel_seed(seed: int) -> None:
    """`model_parallel_cuda_manual_seed` with CPU generator states (same seeds as Megatron)."""
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel import random as mp_random

    tracker = mp_random.get_cuda_rng_tracker()
    tracker.reset()
    tp_rank = parallel_state.get_tensor_model_parallel_rank()
    seeds = {
        mp_random._DATA_PARALLEL_RNG_TRACKER_NAME: seed,
        mp_random._MODEL_PARALLEL_RNG_TRACKER_NAME: seed + 2718 + tp_rank,
        mp_random._EXPERT_PARALLEL_RNG_TRACKER_NAME: seed + 1024,
    }
    for name, value in seeds.items():
        tracker.states_[name] = torch.Generator().manual_seed(value).get_state()
        tracker.seeds_.add(value)
    torch.manual_seed(seed)


def init_parallel(
    tp: int = 1, pp: int = 1, cp: int = 1, hierarchical_cp: Optional[List[int]] = None,
    seed: int = 1234,
) -> None:
    """(Re)build megatron-core's parallel state on an initialised gloo world, and seed RNGs.

    Call it inside `cpu_shims.megatron_on_cpu()`.
    """
    from megatron.core import parallel_state

    if parallel_state.model_parallel_is_initialized():
        parallel_state.destroy_model_parallel()
    parallel_state.initialize_model_parallel(
        tensor_model_parallel_size=tp,
        pipeline_model_parallel_size=pp,
        context_parallel_size=cp,
        hierarchical_context_parallel_sizes=hierarchical_cp,
    )
    cpu_model_parallel_seed(seed)


@dataclass(frozen=True)
class ModelShape:
    """Shape of a Llama-style model: RMSNorm, SwiGLU, RoPE, GQA, untied embeddings."""

    hidden_size: int = 64
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    ffn_hidden_size: int = 128
    vocab_size: int = 128
    seq_length: int = 64


def transformer_config(
    shape: ModelShape,
    *,
    sequence_parallel: bool = False,
    recompute: Optional[str] = None,
    config_class: Any = None,
    **overrides: Any,
) -> Any:
    """TransformerConfig for `shape` on the current parallel state (fp32, no dropout).

    recompute: None, "full" (every layer, uniform) or "selective" (core attention).
    config_class: another TransformerConfig class (MLATransformerConfig for latent attention).
    """
    from megatron.core import parallel_state
    from megatron.core.transformer.transformer_config import TransformerConfig

    kwargs: Dict[str, Any] = dict(
        num_layers=shape.num_layers,
        hidden_size=shape.hidden_size,
        num_attention_heads=shape.num_heads,
        num_query_groups=shape.num_kv_heads,
        ffn_hidden_size=shape.ffn_hidden_size,
        normalization="RMSNorm",
        gated_linear_unit=True,
        activation_func=F.silu,
        add_bias_linear=False,
        attention_dropout=0.0,
        hidden_dropout=0.0,
        params_dtype=torch.float32,
        pipeline_dtype=torch.float32,
        tensor_model_parallel_size=parallel_state.get_tensor_model_parallel_world_size(),
        pipeline_model_parallel_size=parallel_state.get_pipeline_model_parallel_world_size(),
        context_parallel_size=parallel_state.get_context_parallel_world_size(),
        sequence_parallel=sequence_parallel,
        # CPU: no fused CUDA kernels; initialise full weights on CPU then slice for TP.
        use_cpu_initialization=True,
        bias_activation_fusion=False,
        masked_softmax_fusion=False,
        bias_dropout_fusion=False,
        apply_rope_fusion=False,
        persist_layer_norm=False,
        gradient_accumulation_fusion=False,
        # gloo has no batched p2p stream semantics; plain isend/irecv pairs work.
        batch_p2p_comm=False,
    )
    if recompute == "full":
        kwargs.update(recompute_granularity="full", recompute_method="uniform",
                      recompute_num_layers=1)
    elif recompute == "selective":
        kwargs.update(recompute_granularity="selective", recompute_modules=["core_attn"])
    elif recompute is not None:
        raise ValueError(f"recompute must be None, 'full' or 'selective', got {recompute!r}")
    kwargs.update(overrides)
    return (config_class or TransformerConfig)(**kwargs)


def build_gpt(
    config: Any, layer_spec: Any, shape: ModelShape
) -> torch.nn.Module:
    """megatron-core GPTModel (this pipeline stage) with the given layer spec, RoPE, untied."""
    from megatron.core import parallel_state
    from megatron.core.models.gpt import GPTModel

    return GPTModel(
        config=config,
        transformer_layer_spec=layer_spec,
        vocab_size=shape.vocab_size,
        max_sequence_length=shape.seq_length,
        pre_process=parallel_state.is_pipeline_first_stage(),
        post_process=parallel_state.is_pipeline_last_stage(),
        position_embedding_type="rope",
        share_embeddings_and_output_weights=False,
    )


def train_step(
    model: torch.nn.Module,
    batch: Dict[str, Any],
    *,
    num_tokens: int,
) -> torch.Tensor:
    """One forward/backward of `batch` (already split for this CP rank) on this pipeline
    stage, then the gradient reductions of Megatron's DDP. Returns the global mean loss on
    every rank.

    megatron-core's pipeline schedules allocate on device="cuda" directly, so for one
    microbatch the stages hand activations and their gradients over with plain send/recv:
    the same data flow as forward_backward_pipelining_without_interleaving.
    """
    from megatron.core import parallel_state

    for param in model.parameters():
        param.grad = None
    first = parallel_state.is_pipeline_first_stage()
    last = parallel_state.is_pipeline_last_stage()
    input_tensor = None
    if not first:
        input_tensor = torch.empty(_stage_input_shape(model, batch))
        dist.recv(input_tensor, parallel_state.get_pipeline_model_parallel_prev_rank())
        input_tensor.requires_grad_(True)
    model.set_input_tensor(input_tensor)
    output = model(
        batch["tokens"] if first else None,
        batch["position_ids"],
        None,
        labels=batch["labels"] if last else None,
        packed_seq_params=batch.get("packed_seq_params"),
    )
    loss_sum = torch.zeros(())
    if last:
        # Sum over this rank's tokens / tokens of the whole batch: the DPxCP gradient average
        # below divides by cp, and Megatron's schedule multiplies by cp, so scale by cp here.
        loss_sum = (output.float() * batch["loss_mask"]).sum()
        cp_size = parallel_state.get_context_parallel_world_size()
        (loss_sum * cp_size / num_tokens).backward()
    else:
        dist.send(output.detach().contiguous(),
                  parallel_state.get_pipeline_model_parallel_next_rank())
        grad = torch.empty_like(output)
        dist.recv(grad, parallel_state.get_pipeline_model_parallel_next_rank())
        output.backward(grad)
    if not first:
        dist.send(input_tensor.grad.contiguous(),
                  parallel_state.get_pipeline_model_parallel_prev_rank())
    reduce_gradients(model)

    # The last stage holds the loss: sum its CP shards, then share it along the pipeline.
    loss = loss_sum.detach().reshape(1).clone()
    dist.all_reduce(loss, group=parallel_state.get_context_parallel_group())
    dist.all_reduce(loss, group=parallel_state.get_pipeline_model_parallel_group())
    return loss[0] / num_tokens


def _stage_input_shape(model: torch.nn.Module, batch: Dict[str, Any]) -> List[int]:
    """[s_local (/tp with sequence parallel), b, hidden]: the activations between stages."""
    from megatron.core import parallel_state

    seq = batch["labels"].shape[1]  # [b, s] or, packed, [1, t]
    if model.config.sequence_parallel:
        seq //= parallel_state.get_tensor_model_parallel_world_size()
    return [seq, batch["labels"].shape[0], model.config.hidden_size]


def reduce_gradients(model: torch.nn.Module) -> None:
    """The reductions Megatron's DDP and finalize_model_grads do for a dense untied model."""
    from megatron.core import parallel_state

    dp_cp = parallel_state.get_data_parallel_group(with_context_parallel=True)
    tp = parallel_state.get_tensor_model_parallel_group()
    for param in model.parameters():
        if param.grad is None:
            continue
        if getattr(param, "sequence_parallel", False) and tp.size() > 1:
            dist.all_reduce(param.grad, group=tp)
        if dp_cp.size() > 1:
            dist.all_reduce(param.grad, group=dp_cp)
            param.grad /= dp_cp.size()


def split_batch_for_cp(batch: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """This CP rank's zigzag part of a [b, s] batch, with megatron-core's own splitter."""
    from megatron.core import parallel_state
    from megatron.core.utils import get_batch_on_this_cp_rank

    if parallel_state.get_context_parallel_world_size() == 1:
        return dict(batch)
    return get_batch_on_this_cp_rank(dict(batch))
