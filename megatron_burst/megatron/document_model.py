"""GPTModel whose rotary positions restart in every packed document.

megatron-core's GPTModel ignores `position_ids` for RoPE: it builds positions 0..s-1 and
keeps this CP rank's zigzag chunks of them (`get_pos_emb_on_this_cp_rank`). A document
batch needs positions that restart at 0 in every document and follow the batch's layout
(`whole_docs` is not zigzag). The batch already carries exactly those, sharded like the
tokens (`documents.shard_document_batch`), so when `packed_seq_params` is a
`DocumentParams` the model takes Megatron's RoPE table unsplit and gathers its rows at
`position_ids`: [s_local, 1, 1, dim], the shape `apply_rotary_pos_emb` broadcasts over
[s_local, 1, heads, dim] in both the unfused and the fused (TE, sbhd) paths, with or
without tensor and sequence parallelism (queries are whole-sequence by then).

The seam is `GPTModel._preprocess`, which megatron-core 0.16 and 0.19 both call with
keyword arguments and whose second result is the rotary embedding every layer receives.
0.17+ builds GPTModel inside `megatron.training.models.gpt.GPTModelBuilder`, so the
subclass is applied to a built model (`as_document_model`, also a pre-wrap hook); it adds
behaviour only, no state, which is what makes re-classing an instance exact.
"""
from __future__ import annotations

from typing import Any, List

import torch
from megatron.core.models.gpt import GPTModel

from megatron_burst.megatron.attention import BurstDotProductAttention
from megatron_burst.megatron.documents import DocumentParams
from megatron_burst.megatron.mask_batches import MaskParams

# Position embeddings that a per-document position_ids can drive: RoPE through this model,
# learned absolute embeddings through the embedding layer itself, and none.
DOCUMENT_POSITION_EMBEDDINGS = ("rope", "learned_absolute", "none")


class DocumentGPTModel(GPTModel):
    """GPTModel that, for a DocumentParams batch, applies RoPE at the batch's position_ids."""

    def _preprocess(self, *args: Any, **kwargs: Any) -> tuple:
        out = super()._preprocess(*args, **kwargs)
        params = kwargs.get("packed_seq_params")
        # A slice mask's batch (MaskParams) is placed anywhere too: the same positions rule.
        if (not isinstance(params, (DocumentParams, MaskParams))
                or self.position_embedding_type != "rope"):
            return out
        if "position_ids" not in kwargs or out[1] is None:
            raise RuntimeError("GPTModel._preprocess no longer takes position_ids by keyword "
                               "or returns the rotary embedding second: this megatron-core "
                               "version needs a new seam in megatron_burst.megatron."
                               "document_model")
        rope = document_rope(self.rotary_pos_emb, kwargs["position_ids"], params)
        return (out[0], rope, *out[2:])


def document_rope(rotary: torch.nn.Module, position_ids: torch.Tensor,
                  params: DocumentParams) -> torch.Tensor:
    """Rotary frequencies [s_local, 1, 1, dim] at this rank's (sharded) position_ids."""
    if position_ids is None or position_ids.dim() != 2 or position_ids.shape[0] != 1:
        shape = None if position_ids is None else tuple(position_ids.shape)
        raise ValueError(f"document masks need position_ids [1, s_local] on every pipeline "
                         f"stage (the RoPE positions), got {shape}")
    # packed_seq=True: Megatron's table for positions 0..n-1, not split over CP (cached).
    table = rotary(params.max_seqlen_q, packed_seq=True)
    return table.index_select(0, position_ids[0].to(table.device))


def as_document_model(model: GPTModel) -> DocumentGPTModel:
    """Make a built GPTModel (one pipeline stage) honour DocumentParams; ValueError if it can't."""
    if not isinstance(model, GPTModel):
        raise ValueError(f"document masks need megatron-core's GPTModel, got "
                         f"{type(model).__name__}")
    config = model.config
    if model.position_embedding_type not in DOCUMENT_POSITION_EMBEDDINGS:
        raise ValueError(f"document masks support --position-embedding-type "
                         f"{'/'.join(DOCUMENT_POSITION_EMBEDDINGS)}, got "
                         f"{model.position_embedding_type!r}")
    if getattr(config, "multi_latent_attention", False):
        raise ValueError("document masks do not support multi-latent attention (its RoPE "
                         "is applied inside the attention, at positions 0..s-1)")
    if getattr(config, "mtp_num_layers", None):
        raise ValueError("document masks do not support multi-token prediction "
                         "(--mtp-num-layers): its token roll assumes Megatron's layouts")
    cores = [m for name, m in model.named_modules() if name.endswith("core_attention")]
    others = sorted({type(m).__name__ for m in cores
                     if not isinstance(m, BurstDotProductAttention)})
    if others:
        raise ValueError(f"document masks need BurstDotProductAttention as every layer's "
                         f"core attention (the burst layer spec), found {', '.join(others)}")
    model.__class__ = DocumentGPTModel
    for core in cores:  # from now on RoPE follows position_ids: the layers may take documents
        core.positions_follow_documents = True
    return model


def document_models(models: List[GPTModel]) -> List[GPTModel]:
    """`as_document_model` on every model chunk: a megatron-core 0.17+ pre-wrap hook."""
    return [as_document_model(m) for m in models]
