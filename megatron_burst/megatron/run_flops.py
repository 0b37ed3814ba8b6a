"""The FLOPs a Megatron run does, counted from its arguments and its document packs.

Megatron's logged TFLOP/s count full causal attention over the whole sequence (before 0.19,
whatever the documents) and whatever vocabulary its formula is given; a benchmark that
counted the logits with another vocabulary than the run's tokenizer overstated the run's
rate by half. Here the count is ``megatron_burst.decide.flops``'s, fed with what the run does: its
padded vocabulary (``args.padded_vocab_size``, the output layer's rows), GQA heads, SwiGLU,
each layer's mask (sliding windows where Megatron puts them), the documents of every pack
and the recompute setting. ``FlopsReport`` prints the running figures on rank 0 every few
packs, and ``plain_flops_once`` a run's without documents once, in the one format
(``flops.flops_line``) the benchmarks read back.
"""
from __future__ import annotations

from typing import Any, List, Optional, Sequence, Tuple

from megatron.core.transformer.utils import is_layer_window_attention

from megatron_burst.decide.flops import (ModelShape, Recompute, StepFlops, causal_pairs,
                                         flops_line, mla_projections, training_flops)
from megatron_burst.megatron.printer import say


def shape_from_args(args: Any) -> Optional[ModelShape]:
    """The model's matmul shapes from Megatron's arguments; None for what this count does not
    model (mixture-of-experts layers) or cannot know (no padded vocabulary yet: Megatron sets
    it when it builds the tokenizer), so nothing wrong is printed."""
    vocab = getattr(args, "padded_vocab_size", None)  # the rows the logits multiply by
    if getattr(args, "num_experts", None) or not vocab:
        return None
    heads = args.num_attention_heads
    groups = args.num_query_groups if getattr(args, "group_query_attention", False) else heads
    head_dim, mla = args.kv_channels or args.hidden_size // heads, {}
    if getattr(args, "multi_latent_attention", False):  # Q/K at nope + rope dims, V its own
        head_dim = args.qk_head_dim + args.qk_pos_emb_head_dim
        mla = dict(v_head_dim=args.v_head_dim, projections=mla_projections(
            args.hidden_size, heads, args.q_lora_rank, args.kv_lora_rank, head_dim,
            args.qk_pos_emb_head_dim, args.v_head_dim))
    return ModelShape(layers=args.num_layers, hidden=args.hidden_size,
                      ffn_hidden=args.ffn_hidden_size, heads=heads,
                      query_groups=groups or heads, head_dim=head_dim, vocab=vocab,
                      swiglu=bool(getattr(args, "swiglu", False)), **mla)


def recompute_from_args(args: Any) -> Recompute:
    """What Megatron's recompute flags make a step compute twice."""
    granularity = getattr(args, "recompute_granularity", None)
    layers = args.num_layers
    if granularity == "full":
        if getattr(args, "recompute_method", None) == "block":
            # The first N layers of every model chunk (pipeline stage x virtual stage).
            chunks = (getattr(args, "pipeline_model_parallel_size", 1) or 1) * (
                getattr(args, "virtual_pipeline_model_parallel_size", None) or 1)
            layers = min(args.recompute_num_layers or 0, args.num_layers // chunks) * chunks
        return Recompute(layers=layers,
                         keeps_attention=bool(getattr(args, "burst_remat_aware", False)))
    if granularity == "selective":
        modules = getattr(args, "recompute_modules", None) or ["core_attn"]
        return Recompute(attention_layers=layers if "core_attn" in modules else 0,
                         mlp_layers=layers if "mlp" in modules else 0)
    return Recompute()


def layer_windows(args: Any) -> Tuple[Tuple[int, int], ...]:
    """Each layer's sliding window (left, right), (-1, -1) for none, decided as the layers
    decide it (``is_layer_window_attention``, layer numbers from 1)."""
    window = getattr(args, "window_size", None)
    skip = getattr(args, "window_attn_skip_freq", None)
    return tuple(tuple(window) if is_layer_window_attention(window, skip, n) else (-1, -1)
                 for n in range(1, args.num_layers + 1))


def pack_flops(shape: ModelShape, recompute: Recompute, windows: Sequence[Tuple[int, int]],
               lens: Sequence[int]) -> Tuple[StepFlops, float]:
    """(FLOPs of one sequence of documents ``lens``, their mean attention pairs per layer),
    for causal layers with ``windows`` (one per layer)."""
    per_window = {w: causal_pairs(lens, w[0]) for w in set(windows)}
    pairs = sum(per_window[w] for w in windows) / len(windows)
    return training_flops(shape, sum(lens), pairs, recompute), pairs


class FlopsCounter:
    """A run's FLOPs per sequence from its arguments (made once; ``count`` per pack)."""

    def __init__(self, args: Any) -> None:
        self.shape = shape_from_args(args)
        self.recompute = recompute_from_args(args)
        self.windows = layer_windows(args)

    def count(self, lens: Sequence[int]) -> Tuple[Optional[StepFlops], float]:
        """(FLOPs of a sequence of documents ``lens`` or None where not modelled, its causal
        attention pairs per layer as a share of the whole sequence's)."""
        total = sum(lens)
        share = causal_pairs(lens) / max(causal_pairs([total]), 1)
        if self.shape is None:
            return None, share
        return pack_flops(self.shape, self.recompute, self.windows, lens)[0], share


class FlopsReport:
    """Running FLOPs per sequence and the documents' share of causal attention, printed on
    rank 0 every ``EVERY`` sequences (``say``: rank 0's printer)."""

    EVERY = 8

    def __init__(self) -> None:
        self.sequences = self.documents = 0
        self.model = self.hardware = self.share = 0.0
        self.tokens = 0

    def add(self, flops: Optional[StepFlops], share: float, documents: int, tokens: int,
            say: Any) -> None:
        self.sequences += 1
        self.documents += documents
        self.share += share
        self.tokens = tokens
        if flops is not None:
            self.model += flops.model
            self.hardware += flops.hardware
        if self.sequences % self.EVERY == 0 or self.sequences == 1:
            n = self.sequences
            say(f"> document masks: {n} packs of {tokens} tokens, {self.documents / n:.1f} "
                f"documents per pack; causal attention pairs done: {self.share / n:.5f} of "
                f"full causal")
            if flops is not None:
                say(f"> {flops_line(StepFlops(self.model / n, self.hardware / n))}")


def plain_flops_once(args: Any) -> None:
    """Print (once, rank 0) the FLOPs of one sequence without documents: full causal
    attention over ``args.seq_length`` tokens, in the line the benchmarks read."""
    if _PLAIN_SAID:
        return
    _PLAIN_SAID.append(True)
    flops, _ = FlopsCounter(args).count([args.seq_length])
    if flops is not None:
        say(f"> {flops_line(flops)}")


_PLAIN_SAID: List[bool] = []
