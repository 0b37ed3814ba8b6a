"""Megatron-Core core-attention module that runs BurstAttention over the context-parallel group.

`BurstDotProductAttention` is a drop-in `core_attention` for Megatron-Core's `SelfAttention`
(megatron-core 0.16 to 0.19). It takes the tensors Megatron hands to core attention, already
split by `get_batch_on_this_cp_rank` (zigzag, 2*cp chunks) and by tensor parallelism (heads),
and returns the attention output in the same format:

    query [s/cp, b, hq/tp, d], key/value [s/cp, b, hkv/tp, d] (GQA not expanded)
    -> [s/cp, b, hq/tp * d]

or, for packed sequences (THD, `PackedSeqParams`), [t, h, d] -> [t, h * d]. Packed documents
in sbhd come with `DocumentParams` (batch 1, sharded with the layout it names, `whole_docs` by
default; `megatron.documents`); the masks honoured and refused: `megatron.masks`.

Everything that cannot work raises `ValueError` at construction or before any communication,
never a silent fallback (compare Megatron-Bridge #2667, a silently disabled CP).
"""
from __future__ import annotations

import logging
from typing import Any, Mapping, Optional, Tuple

import torch
from torch import Tensor

from megatron.core import parallel_state
from megatron.core.packed_seq_params import PackedSeqParams
from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.module import MegatronModule
from megatron.core.transformer.transformer_config import TransformerConfig
from megatron.core.transformer.utils import is_layer_window_attention

from megatron_burst.attention.agree import check_outcome, tell_peers
from megatron_burst.attention.call_count import check_calls
from megatron_burst.megatron import masks
from megatron_burst.megatron.mask_batches import MaskParams
from megatron_burst.megatron.softmax_offset import make_softmax_offset, sharded_offset
from megatron_burst.attention.api import burst_attn, calls_made
from megatron_burst.decide.topology import CPTopology, HeadShape
from megatron_burst.kernels.selection import default_scale
from megatron_burst.plan.layouts import ZIGZAG
from megatron_burst.megatron.resolve import layer_heads, layer_topology, options_from_megatron
from megatron_burst.megatron.machine_profile import layer_profile
from megatron_burst.decide.options import (AUTO, BurstOptions, check_decided, fixed_topology,
                                           remat_problem)
from megatron_burst.attention.remat import AttentionKeep, in_backward

logger = logging.getLogger(__name__)


def _groups_from(pg_collection: Any) -> Tuple[Any, Any]:
    """(tp_group, cp_group) from a ProcessGroupCollection, or from parallel_state."""
    if pg_collection is not None:
        return getattr(pg_collection, "tp", None), getattr(pg_collection, "cp", None)
    if not parallel_state.model_parallel_is_initialized():
        return None, None
    return (
        parallel_state.get_tensor_model_parallel_group(check_initialized=False),
        parallel_state.get_context_parallel_group(check_initialized=False),
    )


def _refuse_unsupported(config: TransformerConfig, attention_type: str,
                        attention_dropout: Optional[float], kwargs: Mapping[str, Any]) -> None:
    """Raise ValueError for what BurstAttention does not do: a BurstAttention option spelled
    as a keyword of its own (it would be silently dropped), cross-attention, dropout."""
    stray = sorted(k for k in kwargs if k.startswith("burst"))
    if stray:
        raise ValueError(f"BurstDotProductAttention got {stray}: pass burst_options="
                         f"{{...}} (BurstOptions' topology fields) or topology=...")
    if attention_type != "self":
        raise ValueError(
            f"BurstDotProductAttention supports self-attention only, got {attention_type!r}"
        )
    dropout = config.attention_dropout if attention_dropout is None else attention_dropout
    if dropout and dropout > 0:
        raise ValueError(
            f"BurstAttention has no attention dropout, got attention_dropout={dropout}; "
            f"set --attention-dropout 0 (config.attention_dropout=0.0)"
        )


def _checked_groups(config: TransformerConfig, pg_collection: Any) -> Tuple[Any, Any]:
    """(tp_group, cp_group), refusing a missing CP group or one of another size than the
    config's context_parallel_size."""
    tp_group, cp_group = _groups_from(pg_collection)
    if cp_group is None:
        raise ValueError(
            "BurstAttention needs a context-parallel process group: pass pg_collection "
            "with .cp or initialize megatron.core.parallel_state first"
        )
    cp_size = cp_group.size()
    if config.context_parallel_size not in (1, cp_size):
        raise ValueError(
            f"config.context_parallel_size={config.context_parallel_size} but the CP group "
            f"has {cp_size} ranks"
        )
    return tp_group, cp_group


def _layer_choice(config: TransformerConfig, cp_comm_type: Optional[str], cp_size: int,
                  heads: HeadShape, tp_size: int, topology: Optional[CPTopology],
                  burst_options: Optional[Mapping[str, Any]]
                  ) -> Tuple[Optional[CPTopology], Optional[BurstOptions]]:
    """(topology, None) when the layer's topology is decided now: handed down (and checked
    against the options) or fixed by them; (None, options) while 'auto' waits for the
    first call's tokens, what is fixed checked now, so a bad option is named when the model
    is built. Megatron's CP settings are read either way: a handed-down topology's Ulysses
    size counts as given, and --cp-comm-type and the hierarchical sizes must agree with it."""
    given = dict(burst_options or {})
    if topology is not None:
        given.setdefault("ulysses_size", topology.ulysses)
    options = options_from_megatron(cp_size, cp_comm_type,
                                    config.hierarchical_context_parallel_sizes, given)
    if topology is not None:
        return check_decided(topology, options, cp=cp_size, heads=heads), None
    if AUTO not in (options.backward, options.ulysses_size, options.intra_node_size):
        return layer_topology(options, cp_size, heads, 0, tp_size), None
    fixed_topology(options, cp=cp_size, heads=heads)
    return None, options


def _remat_keep(config: TransformerConfig, remat_aware: bool) -> Optional[AttentionKeep]:
    """The layer's kept attention outputs under remat-aware recompute (None without it);
    ValueError where the config's recompute leaves nothing to keep them for."""
    problem = remat_problem(remat_aware, getattr(config, "recompute_granularity", None))
    if problem:
        raise ValueError(f"remat_aware: {problem} (config.recompute_granularity)")
    return AttentionKeep(limit=_keep_limit(config)) if remat_aware else None


def _layer_window(config: TransformerConfig, layer_number: int) -> Tuple[int, int]:
    """The layer's sliding window, where Megatron puts one ((-1, -1): none)."""
    if is_layer_window_attention(
        config.window_size, getattr(config, "window_attn_skip_freq", None), layer_number
    ):
        return tuple(config.window_size)
    return (-1, -1)


class BurstDotProductAttention(MegatronModule):
    """Exact attention over the context-parallel group with BurstAttention.

    Built by Megatron's `SelfAttention` from the spec's `core_attention`; accepts every keyword
    argument megatron-core 0.16 to 0.19 passes. What BurstAttention itself needs comes in the
    spec's params (`megatron_burst.megatron.spec`): `topology`, the run's `CPTopology` decided
    once by the entry point, or else `burst_options` (the options a spec provider was given,
    resolved with Megatron's CP settings at the layer's first call); and `remat_aware`.
    """

    def __init__(
        self,
        # Megatron's core-attention contract: what SelfAttention / MLASelfAttention pass.
        config: TransformerConfig,
        layer_number: int,
        attn_mask_type: AttnMaskType,
        attention_type: str = "self",
        attention_dropout: Optional[float] = None,
        softmax_scale: Optional[float] = None,
        cp_comm_type: Optional[str] = None,
        pg_collection: Any = None,
        model_comm_pgs: Any = None,
        k_channels: Optional[int] = None,
        v_channels: Optional[int] = None,
        num_splits: Optional[int] = None,
        *,
        # BurstAttention's own: the spec's params (`BurstSpecProvider`).
        topology: Optional[CPTopology] = None,
        burst_options: Optional[Mapping[str, Any]] = None,
        remat_aware: bool = False,
        **kwargs: Any,
    ) -> None:
        # **kwargs: later megatron-core versions add builder arguments (as 0.16 added
        # k_channels/v_channels/num_splits); those that change the math are handled here,
        # the rest (kernel tuning such as num_splits) do not apply to the ring.
        super().__init__(config=config)
        _refuse_unsupported(config, attention_type, attention_dropout, kwargs)
        self.layer_number = max(1, layer_number)
        self.attn_mask_type = attn_mask_type
        # 0.13/0.14 call it model_comm_pgs, 0.15+ pg_collection.
        self.tp_group, self.cp_group = _checked_groups(config, pg_collection or model_comm_pgs)
        self.tp_size = self.tp_group.size() if self.tp_group is not None else 1
        # MLA hands Q/K and V heads of their own dims (192 and 128): both travel as they are.
        self.k_channels = k_channels or config.kv_channels
        self.v_channels = v_channels or config.kv_channels
        self.heads = layer_heads(config, self.tp_size, self.k_channels, self.v_channels)
        # Sinks (softmax_type "off-by-one" / "learnable"), one logit per head of this TP rank.
        make_softmax_offset(self, config, self.heads.hq)
        # The decided topology; or, while 'auto' is undecided, the options (kept only then).
        self.topology, self.options = _layer_choice(
            config, cp_comm_type, self.cp_group.size(), self.heads, self.tp_size, topology,
            burst_options)
        # Remat-aware recompute (--burst-remat-aware): this layer's kept attention outputs.
        self.keep = _remat_keep(config, remat_aware)
        name = _group_name(self.cp_group)
        _FIRST_LAYER[name] = min(_FIRST_LAYER.get(name, self.layer_number), self.layer_number)
        # apply_query_key_layer_scaling divides the scale by layer_number and multiplies the
        # fp32 scores back by it (an fp16 overflow guard): the net softmax scale is unchanged,
        # and BurstAttention's kernels already merge in fp32, so the base scale is the answer.
        self.softmax_scale = (
            softmax_scale if softmax_scale is not None else default_scale(self.k_channels)
        )
        self.window_size: Tuple[int, int] = _layer_window(config, layer_number)
        # DocumentParams put documents anywhere on any rank (whole_docs); GPTModel's own RoPE
        # assumes zigzag positions 0..s-1. `document_model.as_document_model` sets this once
        # the model's positions follow the batch's position_ids instead.
        self.positions_follow_documents = False
        if self.layer_number == 1 and torch.distributed.get_rank() == 0:
            self._log_choice()

    def _log_choice(self) -> None:
        logger.info("BurstAttention layer 1: %s, tp=%d", self.topology.describe()
                    if self.topology else f"options {self.options} ('auto' decided "
                    f"at the first call)", self.tp_size)

    def forward(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        attention_mask: Optional[Tensor],
        attn_mask_type: Optional[AttnMaskType] = None,
        attention_bias: Optional[Tensor] = None,
        packed_seq_params: Optional[PackedSeqParams] = None,
        **kwargs: Any,
    ) -> Tensor:
        """Attention over the whole sequence; returns [s/cp, b, hq*dv] (THD: [t, hq*dv]).

        The mask comes from the mask type and `packed_seq_params` (`masks.documents_of`);
        `attention_mask` is not read, and is refused where it says more than they do
        (`masks.check_attention_mask`). A check that fails on one rank fails on every rank
        of the CP group, before any message moves (`agree`).
        """
        if self.layer_number == _FIRST_LAYER.get(_group_name(self.cp_group)) and not in_backward():
            # A micro-batch's first forward reaches this stage's first layer: every rank of
            # the group must have made as many attention calls as its peers (call_count).
            check_calls(self.cp_group, calls_made(self.cp_group))
        try:
            thd, kwargs_for_burst = self._burst_arguments(query, key, value, attention_mask,
                                                          attn_mask_type, attention_bias,
                                                          packed_seq_params)
            error = None
        except ValueError as err:
            error = err
        if attention_mask is not None or (packed_seq_params is not None
                                          and packed_seq_params.qkv_format == "thd"):
            # These checks read this call's data (the mask, the boundaries): their outcome
            # can differ by rank and by call, so every call compares them.
            check_outcome(self.cp_group, error)
        elif error is not None:
            tell_peers(self.cp_group, error)  # as burst_attn does for its own checks
        if thd:
            # [t, h, d] -> [1, t, h, d]: a packed sequence is one batch row of documents.
            query, key, value = (x.unsqueeze(0) for x in (query, key, value))
        out = burst_attn(query, key, value, self.cp_group, **kwargs_for_burst)
        if thd:
            return out.reshape(out.size(1), -1)
        return out.reshape(out.size(0), out.size(1), -1)

    def _burst_arguments(self, query: Tensor, key: Tensor, value: Tensor,
                         attention_mask: Optional[Tensor], attn_mask_type: Optional[AttnMaskType],
                         attention_bias: Optional[Tensor],
                         packed_seq_params: Optional[PackedSeqParams]) -> Tuple[bool, dict]:
        """(THD?, burst_attn's keyword arguments) for this call, or ValueError for what it
        cannot honour (this rank's checks; ``forward`` tells the peers)."""
        if attention_bias is not None:
            raise ValueError("BurstAttention does not support attention_bias")
        mask_type = self.attn_mask_type if attn_mask_type is None else attn_mask_type
        causal = masks.is_causal(mask_type)
        if isinstance(packed_seq_params, MaskParams):
            return False, self._mask_arguments(packed_seq_params, attention_mask, query, key,
                                               value)
        docs = masks.documents_of(packed_seq_params, causal, self.cp_group)
        if docs is not None and docs.qkv_format == "sbhd" and not self.positions_follow_documents:
            raise ValueError(
                "DocumentParams need a model whose positions follow the documents: convert it "
                "with megatron_burst.megatron.document_model.as_document_model (GPTModel's "
                "RoPE ignores position_ids)"
            )
        thd = docs is not None and docs.qkv_format == "thd"
        s_local = query.size(0)  # [t, h, d] and [s, b, h, d] both lead with the sequence
        masks.check_attention_mask(attention_mask, mask_type, docs, s_local, self.cp_group)
        cp = self.cp_group.size()
        divisor = ZIGZAG.divisor(cp)
        if docs is None and (s_local * cp) % divisor:  # Megatron's split: zigzag
            raise ValueError(f"sequence length {s_local * cp} is not divisible by 2*cp = "
                             f"{divisor} (zigzag layout)")
        return thd, dict(
            self._layer_arguments(s_local * (1 if thd else query.size(1)), query, key, value),
            causal=causal,
            window_size=self.window_size,
            layout=ZIGZAG.name if docs is None else docs.layout,
            qkv_format="bshd" if thd else "sbhd",
            cu_seqlens=masks.boundaries_of(docs, s_local * cp),
        )

    def _layer_arguments(self, tokens: int, *qkv: Tensor) -> dict:
        """burst_attn's arguments that are the layer's own, whatever the batch: its scale,
        topology ('auto' decided now that the ``tokens`` per rank are known, from this
        machine's profile: `machine_profile`), kept outputs, label and sinks."""
        if self.topology is None:
            self.topology = layer_topology(
                self.options, self.cp_group.size(), self.heads, tokens, self.tp_size,
                machine=layer_profile(self.options, self.cp_group, *qkv))
        return dict(
            softmax_scale=self.softmax_scale,
            topology=self.topology,
            # Remat-aware recompute: the checkpoint's first forward keeps the output, the
            # recompute takes it (never outside training, so evaluation keeps nothing).
            keep=self.keep if self.training else None,
            call_label=self.layer_number,  # a peer in another layer's call is caught
            sinks=self.softmax_offset,
        )

    def _mask_arguments(self, params: MaskParams, attention_mask: Optional[Tensor],
                        query: Tensor, *kv: Tensor) -> dict:
        """burst_attn's arguments under a slice mask (``mask_batches``), which replaces the
        layer's causal mask; a window or attention_mask beside it is refused."""
        if not self.positions_follow_documents:
            raise ValueError("MaskParams need a model whose positions follow the batch: "
                             "megatron_burst.megatron.document_model.as_document_model")
        if self.window_size != (-1, -1) or attention_mask is not None:
            raise ValueError("a slice mask (MaskParams) says the whole mask: a layer window "
                             "or an attention_mask beside it is refused")
        return dict(self._layer_arguments(query.size(0) * query.size(1), query, *kv),
                    mask=params.mask, layout=params.layout, qkv_format="sbhd")

    def sharded_state_dict(self, prefix: str = "", sharded_offsets: tuple = (),
                           metadata: Optional[dict] = None) -> dict:
        """The learnable sinks sharded by heads over TP, as Megatron's DotProductAttention
        saves them (the layer holds nothing else)."""
        return sharded_offset(self, prefix, sharded_offsets, metadata, self.tp_group)


# The first BurstAttention layer built on each CP group in this process (by group name):
# where each micro-batch's forward starts on this pipeline stage.
_FIRST_LAYER: dict[Optional[str], int] = {}


def _group_name(group: Any) -> Optional[str]:
    return getattr(group, "group_name", None)


def _keep_limit(config: TransformerConfig) -> int:
    """Micro-batches a layer can have in flight (1F1B: up to the pipeline size; interleaved:
    up to twice the stages times the chunks), with room: kept outputs beyond it are dropped
    (their recomputes then run the ring, exact and slower)."""
    pp = getattr(config, "pipeline_model_parallel_size", 1) or 1
    vpp = getattr(config, "virtual_pipeline_model_parallel_size", None) or 1
    return 2 * pp * vpp + 2
