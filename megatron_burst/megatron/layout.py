"""Which `CPLayout` a Megatron attention layer runs: the adapter's one layout policy.

A layer's layout comes from, in order of precedence:
1. explicit options bound into the spec (`BurstSpecProvider(backward=..., intra_node_size=...,
   ulysses_size=...)`), read together with Megatron's CP settings;
2. `config.burst_layout`, which `megatron_burst.megatron.arguments.apply_burst_args` puts on
   the TransformerConfig from the command line (so the whole model shares one value);
3. Megatron's own CP settings alone (`--cp-comm-type`, hierarchical sizes).
Every layer of a model asks with the same arguments, so the value is built once per model
(`functools.lru_cache`), and every layer logs nothing but the first.
"""
from __future__ import annotations

import functools
from typing import Any, Optional, Sequence, Tuple

from megatron_burst.cp_layout import CPLayout, HeadShape


def layer_heads(config: Any, tp_size: int, head_dim: int) -> HeadShape:
    """Heads one TP rank holds, and bytes per activation element, from a TransformerConfig."""
    heads = config.num_attention_heads
    groups = config.num_query_groups or heads
    for count, what in ((heads, "num_attention_heads"), (groups, "num_query_groups")):
        if count % tp_size:
            raise ValueError(f"{what} over tensor parallel size: {count} is not divisible by "
                             f"{tp_size}")
    half = getattr(config, "bf16", False) or getattr(config, "fp16", False)
    return HeadShape(heads // tp_size, groups // tp_size, head_dim, 2 if half else 4)


def layer_layout(config: Any, cp_comm_type: Optional[str], cp_size: int, heads: HeadShape, *,
                 backward: Optional[str] = None, intra_node_size: Optional[int] = None,
                 ulysses_size: Optional[int] = None) -> CPLayout:
    """The layout of one attention layer (see the module docstring for precedence)."""
    preset: Optional[CPLayout] = getattr(config, "burst_layout", None)
    explicit = (backward, intra_node_size, ulysses_size) != (None, None, None)
    if preset is not None and not explicit:
        if (preset.cp, preset.heads) != (cp_size, heads):
            raise ValueError(
                f"config.burst_layout was built for cp={preset.cp}, heads {preset.heads}, but "
                f"this layer has cp={cp_size}, heads {heads}")
        return preset
    hier = config.hierarchical_context_parallel_sizes
    return _cached_layout(cp_size, cp_comm_type, tuple(hier) if hier else None, heads,
                          backward, intra_node_size, ulysses_size)


@functools.lru_cache(maxsize=64)
def _cached_layout(cp_size: int, cp_comm_type: Optional[str],
                   hier: Optional[Tuple[int, ...]], heads: HeadShape, backward: Optional[str],
                   intra_node_size: Optional[int], ulysses_size: Optional[int]) -> CPLayout:
    return CPLayout.from_megatron(cp_size, cp_comm_type, hier, backward=backward,
                                  intra_node_size=intra_node_size, ulysses_size=ulysses_size,
                                  heads=heads)


def comm_types(cp_comm_type: Any) -> Sequence[Any]:
    """--cp-comm-type as a list (Megatron allows one value per layer)."""
    return cp_comm_type if isinstance(cp_comm_type, list) else [cp_comm_type]
