"""Command-line options that select BurstAttention in a Megatron run.

`add_burst_args` is an `extra_args_provider` for megatron.training: it adds --burst-backward,
--burst-intra-node-size and --burst-ulysses-size (Megatron's own --cp-comm-type already takes
any string, so `--cp-comm-type burst` / `a2a+burst` parse as they are).
`burst_layout_from_args` validates the command line on every rank before any communication
and builds the run's one `CPLayout`; `apply_burst_args` puts it on the TransformerConfig,
where every `BurstDotProductAttention` layer reads it.
"""
from __future__ import annotations

import argparse
from typing import Any, Optional

from megatron_burst.cp_layout import BACKWARD_MODES, COMM_TYPE_ALIASES, CPLayout
from megatron_burst.megatron.layout import comm_types

# What a user writes to ask for BurstAttention (the aliases p2p / a2a+p2p also run it when
# the burst layer spec is in place, but do not by themselves select it).
BURST_COMM_TYPES = tuple(sorted({v for v in COMM_TYPE_ALIASES.values()}))


def add_burst_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the --burst-* options to a Megatron argument parser."""
    group = parser.add_argument_group("BurstAttention (megatron_burst)")
    group.add_argument("--burst-backward", choices=BACKWARD_MODES, default="auto",
                       help="Backward ring: 'burst' moves Q/dO/dQ, 'ring' moves K/V/dK/dV; "
                            "'auto' picks the one with fewer bytes for the layer shape.")
    group.add_argument("--burst-intra-node-size", type=int, default=None,
                       help="CP ranks per node for the topology-aware double ring, counted "
                            "in ranks (Ulysses ranks included); default: from "
                            "--hierarchical-context-parallel-sizes, else a flat ring.")
    group.add_argument("--burst-ulysses-size", type=int, default=None,
                       help="Ranks that split heads by all-to-all before the ring "
                            "(default 1; with --cp-comm-type a2a+burst the first "
                            "hierarchical size).")
    return parser


def uses_burst(args: argparse.Namespace) -> bool:
    """Whether --cp-comm-type selects BurstAttention (per-layer lists must not mix)."""
    types = comm_types(args.cp_comm_type)
    chosen = [t in BURST_COMM_TYPES for t in types]
    if any(chosen) and not all(chosen):
        raise ValueError(f"--cp-comm-type {types}: burst cannot be mixed per layer with TE modes")
    if len(set(types)) > 1:
        raise ValueError(f"--cp-comm-type {types}: give one BurstAttention mode for all layers")
    return all(chosen)


def burst_layout_from_args(args: argparse.Namespace) -> CPLayout:
    """The layout the attention layers will use; raises ValueError for impossible settings."""
    if args.context_parallel_size < 1:
        raise ValueError("--cp-comm-type burst needs --context-parallel-size >= 1")
    layout = CPLayout.from_megatron_args(args)
    cp = args.context_parallel_size
    if args.seq_length % (2 * cp):
        raise ValueError(f"--seq-length {args.seq_length} is not divisible by 2*cp = {2 * cp}")
    if args.attention_dropout:
        raise ValueError(f"BurstAttention has no attention dropout; pass --attention-dropout 0 "
                         f"(got {args.attention_dropout})")
    return layout


def apply_burst_args(args: argparse.Namespace, config: Any,
                     layout: Optional[CPLayout] = None) -> CPLayout:
    """Put the run's layout on `config` (a TransformerConfig, or one that proxies it)."""
    layout = layout or burst_layout_from_args(args)
    config.burst_layout = layout
    return layout
