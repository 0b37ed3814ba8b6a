"""CPU-only compatibility layer for running megatron-core's GPTModel on gloo ranks.

megatron-core assumes CUDA in a handful of places that have nothing to do with the model's
math. On a CPU host (CI, a laptop) `apply_cpu_shims()` replaces exactly those places, so a
small Llama-style GPTModel with BurstAttention runs with tensor, pipeline, context and
sequence parallelism over gloo. Nothing here is imported by the attention or spec code, and
nothing here is used on a GPU host: `apply_cpu_shims` refuses to run when CUDA is available.

What is shimmed (found on megatron-core 0.16.1 and 0.19.2 with torch CPU builds):
- `torch.cuda.current_device()`: RoPE, the global memory buffer and the pipeline p2p code
  allocate on it; it returns "cpu" here.
- `torch.cuda.synchronize()`: the pipeline p2p code calls it around batched send/recv; a
  no-op on CPU, where gloo's wait() is already synchronous.
- the tensor-parallel RNG tracker keeps CUDA generator states; here it keeps CPU ones
  (`cpu_model_parallel_seed` replaces `model_parallel_cuda_manual_seed`).
- `rope_utils.get_pos_emb_on_this_cp_rank` builds its index with pin_memory + .cuda(), and
  `transformer.utils.get_default_causal_mask` (Megatron's local attention) uses device="cuda".

The rest is what a CPU run needs: `tiny_llama_config` / `build_gpt` build the model, and
`train_step` runs one forward/backward on this pipeline stage (megatron-core's schedules
allocate on device="cuda", so stages exchange activations with plain send/recv) and does the
gradient reductions Megatron's DDP + finalize_model_grads do (average over DPxCP,
sequence-parallel norm grads summed over TP).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional

import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F

_SHIMMED = False


def apply_cpu_shims() -> None:
    """Patch megatron-core's CUDA-only call sites for a CPU run (idempotent)."""
    global _SHIMMED
    if _SHIMMED:
        return
    if torch.cuda.is_available():
        raise RuntimeError("apply_cpu_shims is for CPU-only hosts; this host has CUDA")
    from megatron.core.models.common.embeddings import rope_utils
    from megatron.core.tensor_parallel import random as mp_random

    torch.cuda.current_device = lambda: "cpu"
    torch.cuda.synchronize = lambda *args, **kwargs: None
    mp_random._get_cuda_rng_state = lambda *args, **kwargs: torch.get_rng_state()
    mp_random._set_cuda_rng_state = lambda state, *args, **kwargs: torch.set_rng_state(state)
    from megatron.core.transformer import utils as transformer_utils

    _rebind(rope_utils, "get_pos_emb_on_this_cp_rank", _get_pos_emb_on_this_cp_rank_cpu)
    _rebind(transformer_utils, "get_default_causal_mask", _get_default_causal_mask_cpu)
    _SHIMMED = True


def _rebind(home: Any, name: str, replacement: Any) -> None:
    """Replace `home.name` everywhere it was imported by name (`from x import name`)."""
    import megatron.core.models.gpt  # noqa: F401  (import every user of it first)

    original = getattr(home, name)
    for module in list(sys.modules.values()):
        if getattr(module, name, None) is original:
            setattr(module, name, replacement)


def _get_default_causal_mask_cpu(sq: int) -> torch.Tensor:
    """transformer.utils.get_default_causal_mask without device="cuda"."""
    return torch.triu(torch.ones(sq, sq), diagonal=1).bool()


def _get_pos_emb_on_this_cp_rank_cpu(
    pos_emb: torch.Tensor, seq_dim: int, cp_group: dist.ProcessGroup
) -> torch.Tensor:
    """rope_utils.get_pos_emb_on_this_cp_rank without pin_memory/.cuda(): zigzag chunks."""
    cp_size, cp_rank = cp_group.size(), cp_group.rank()
    index = torch.tensor([cp_rank, 2 * cp_size - cp_rank - 1], device=pos_emb.device)
    pos_emb = pos_emb.view(*pos_emb.shape[:seq_dim], 2 * cp_size, -1, *pos_emb.shape[seq_dim + 1 :])
    pos_emb = pos_emb.index_select(seq_dim, index)
    return pos_emb.view(*pos_emb.shape[:seq_dim], -1, *pos_emb.shape[seq_dim + 2 :])


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
    tp: int = 1, pp: int = 1, cp: int = 1, hierarchical_cp: Optional[List[int]] = None, seed: int = 1234
) -> None:
    """(Re)build megatron-core's parallel state on an initialised gloo world, and seed RNGs."""
    from megatron.core import parallel_state

    apply_cpu_shims()
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
class TinyLlama:
    """Shape of the test model: RMSNorm, SwiGLU, RoPE, GQA, untied embeddings."""

    hidden_size: int = 64
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    ffn_hidden_size: int = 128
    vocab_size: int = 128
    seq_length: int = 64


def tiny_llama_config(
    shape: TinyLlama = TinyLlama(),
    *,
    sequence_parallel: bool = False,
    recompute: Optional[str] = None,
    **overrides: Any,
) -> Any:
    """TransformerConfig for `shape` on the current parallel state (fp32, no dropout).

    recompute: None, "full" (every layer, uniform) or "selective" (core attention).
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
        kwargs.update(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1)
    elif recompute == "selective":
        kwargs.update(recompute_granularity="selective", recompute_modules=["core_attn"])
    elif recompute is not None:
        raise ValueError(f"recompute must be None, 'full' or 'selective', got {recompute!r}")
    kwargs.update(overrides)
    return TransformerConfig(**kwargs)


def build_gpt(
    config: Any, layer_spec: Any, shape: TinyLlama = TinyLlama()
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


def build_tiny_llama(shape: TinyLlama = TinyLlama(), spec_kwargs: Optional[Dict[str, Any]] = None,
                     **config_kwargs: Any) -> torch.nn.Module:
    """The tiny Llama-style GPTModel with BurstDotProductAttention, on the current parallel state.

    ``spec_kwargs`` go to the layer spec (backward, intra_node_size, ulysses_size).
    """
    from megatron_burst.megatron.spec import get_llama_layer_burst_spec

    config = tiny_llama_config(shape, **config_kwargs)
    spec = get_llama_layer_burst_spec(config, use_te=False, **(spec_kwargs or {}))
    return build_gpt(config, spec, shape)


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
        dist.send(output.detach().contiguous(), parallel_state.get_pipeline_model_parallel_next_rank())
        grad = torch.empty_like(output)
        dist.recv(grad, parallel_state.get_pipeline_model_parallel_next_rank())
        output.backward(grad)
    if not first:
        dist.send(input_tensor.grad.contiguous(), parallel_state.get_pipeline_model_parallel_prev_rank())
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


def random_batch(shape: TinyLlama, batch_size: int = 2, seed: int = 0) -> Dict[str, torch.Tensor]:
    """A reproducible language-modelling batch: tokens, next-token labels, mask, positions."""
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, shape.vocab_size, (batch_size, shape.seq_length + 1), generator=gen)
    return {
        "tokens": tokens[:, :-1].contiguous(),
        "labels": tokens[:, 1:].contiguous(),
        "loss_mask": torch.ones(batch_size, shape.seq_length),
        "position_ids": torch.arange(shape.seq_length).expand(batch_size, -1).contiguous(),
    }


def run_tiny_llama(
    steps: int = 1,
    *,
    tp: int = 1,
    pp: int = 1,
    cp: int = 1,
    shape: TinyLlama = TinyLlama(),
    lr: float = 1e-3,
    **config_kwargs: Any,
) -> List[float]:
    """On every rank of an initialised gloo world: build the tiny Llama with BurstAttention and
    train `steps` Adam steps on one random batch; returns the losses (the same on all ranks)."""
    init_parallel(tp=tp, pp=pp, cp=cp)
    model = build_tiny_llama(shape, **config_kwargs)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    batch = split_batch_for_cp(random_batch(shape))
    num_tokens = int(random_batch(shape)["loss_mask"].sum())
    losses = []
    for _ in range(steps):
        loss = train_step(model, batch, num_tokens=num_tokens)
        optimizer.step()
        losses.append(float(loss))
    return losses
