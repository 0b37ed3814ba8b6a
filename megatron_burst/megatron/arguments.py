"""Command-line options that select BurstAttention in a Megatron run.

`add_burst_args` is an `extra_args_provider` for megatron.training: it adds --burst-backward,
--burst-intra-node-size and --burst-ulysses-size (Megatron's own --cp-comm-type already takes
any string, so `--cp-comm-type burst` / `a2a+burst` parse as they are). `apply_burst_args`
copies them onto the TransformerConfig, where BurstDotProductAttention reads them, and
validates the layout on every rank before any communication.
"""
from __future__ import annotations

import argparse
from typing import Any, Optional

from megatron_burst.megatron.attention import BurstLayout, resolve_layout

BURST_COMM_TYPES = ("burst", "a2a+burst")


def add_burst_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the --burst-* options to a Megatron argument parser."""
    group = parser.add_argument_group("BurstAttention (megatron_burst)")
    group.add_argument("--burst-backward", choices=("auto", "burst", "ring"), default="auto",
                       help="Backward ring: 'burst' moves Q/dO/dQ, 'ring' moves K/V/dK/dV; "
                            "'auto' picks the one with fewer bytes for the layer shape.")
    group.add_argument("--burst-intra-node-size", type=int, default=None,
                       help="Ranks per node for the topology-aware double ring "
                            "(default: --hierarchical-context-parallel-sizes[0], else flat).")
    group.add_argument("--burst-ulysses-size", type=int, default=None,
                       help="Ranks that split heads by all-to-all before the ring "
                            "(default 1; with --cp-comm-type a2a+burst the first "
                            "hierarchical size).")
    return parser


def uses_burst(args: argparse.Namespace) -> bool:
    """Whether --cp-comm-type selects BurstAttention (per-layer lists must not mix)."""
    types = args.cp_comm_type if isinstance(args.cp_comm_type, list) else [args.cp_comm_type]
    chosen = [t in BURST_COMM_TYPES for t in types]
    if any(chosen) and not all(chosen):
        raise ValueError(f"--cp-comm-type {types}: burst cannot be mixed per layer with TE modes")
    return all(chosen)


def burst_layout_from_args(args: argparse.Namespace) -> BurstLayout:
    """The layout the attention layers will use; raises ValueError for impossible settings."""
    if args.context_parallel_size < 1:
        raise ValueError("--cp-comm-type burst needs --context-parallel-size >= 1")
    comm = args.cp_comm_type[0] if isinstance(args.cp_comm_type, list) else args.cp_comm_type
    layout = resolve_layout(
        args.context_parallel_size, comm, args.hierarchical_context_parallel_sizes,
        backward=args.burst_backward, intra_node_size=args.burst_intra_node_size,
        ulysses_size=args.burst_ulysses_size,
    )
    cp, tp = args.context_parallel_size, args.tensor_model_parallel_size
    if args.seq_length % (2 * cp):
        raise ValueError(f"--seq-length {args.seq_length} is not divisible by 2*cp = {2 * cp}")
    heads = args.num_attention_heads
    kv_heads = args.num_query_groups if args.group_query_attention else heads
    for name, count in (("--num-attention-heads", heads), ("--num-query-groups", kv_heads)):
        if count % tp or (count // tp) % layout.ulysses_size:
            raise ValueError(f"{name} {count} must be divisible by tp {tp} x ulysses "
                             f"{layout.ulysses_size}")
    if args.attention_dropout:
        raise ValueError(f"BurstAttention has no attention dropout; pass --attention-dropout 0 "
                         f"(got {args.attention_dropout})")
    return layout


def apply_burst_args(args: argparse.Namespace, config: Any, layout: Optional[BurstLayout] = None) -> BurstLayout:
    """Put the burst options on `config` (a TransformerConfig, or a config that proxies one)."""
    layout = layout or burst_layout_from_args(args)
    config.burst_backward = layout.backward
    config.burst_intra_node_size = layout.intra_node_size
    config.burst_ulysses_size = layout.ulysses_size
    return layout
