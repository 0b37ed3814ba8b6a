"""Command-line options that select BurstAttention in a Megatron run.

`add_burst_args` is an `extra_args_provider` for megatron.training: it adds --burst-backward,
--burst-intra-node-size and --burst-ulysses-size (Megatron's own --cp-comm-type already takes
any string, so `--cp-comm-type burst` / `a2a+burst` parse as they are), and the document
mask options --burst-document-mask and --burst-document-layout.
`burst_layout_from_args` validates the command line on every rank before any communication
and builds the run's one `CPLayout`; `apply_burst_args` puts it on the TransformerConfig,
where every `BurstDotProductAttention` layer reads it. `document_layout_from_args` checks the
document options (and refuses Megatron's --reset-* flags, which the entry point would
otherwise ignore).
"""
from __future__ import annotations

import argparse
from typing import Any, Optional

from megatron_burst.cp_layout import BACKWARD_MODES, COMM_TYPE_ALIASES, CPLayout
from megatron_burst.megatron.layout import comm_types

# How a document batch may be sharded over the CP group: `whole_docs` keeps short documents
# on one rank; `zigzag` splits every document over all ranks, padded to 2*cp.
DOCUMENT_LAYOUTS = ("whole_docs", "zigzag")

# What a user writes to ask for BurstAttention (the aliases p2p / a2a+p2p also run it when
# the burst layer spec is in place, but do not by themselves select it).
BURST_COMM_TYPES = tuple(sorted({v for v in COMM_TYPE_ALIASES.values()}))


def add_burst_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the --burst-* options to a Megatron argument parser."""
    group = parser.add_argument_group("BurstAttention (megatron_burst)")
    group.add_argument("--burst-backward", choices=BACKWARD_MODES, default="auto",
                       help="Backward ring: 'burst' moves Q/dO/dQ, 'ring' moves K/V/dK/dV; "
                            "'auto' picks the one with fewer bytes for the layer shape.")
    group.add_argument("--burst-intra-node-size", type=_int_or_auto, default=None,
                       help="CP ranks per node for the topology-aware double ring, counted "
                            "in ranks (Ulysses ranks included), or 'auto' (the time model "
                            "decides); default: from --hierarchical-context-parallel-sizes, "
                            "else a flat ring.")
    group.add_argument("--burst-ulysses-size", type=_int_or_auto, default=None,
                       help="Ranks that split heads by all-to-all before the ring, or 'auto' "
                            "(the time model picks the fastest split); default 1 (with "
                            "--cp-comm-type a2a+burst the first hierarchical size).")
    group.add_argument("--burst-profile", default=None,
                       help="The cluster profile the time model reads for 'auto': a file "
                            "written by `megatron-burst tune`, or a shipped name "
                            "(h200-nvlink, a100-ib); default $MEGATRON_BURST_PROFILE, else "
                            "h200-nvlink.")
    group.add_argument("--burst-remat-aware", action="store_true",
                       help="With --recompute-granularity full: keep each layer's attention "
                            "output and lse from the first forward, so the recompute skips "
                            "the attention ring (costs that output per layer in memory).")
    group.add_argument("--burst-document-mask", action="store_true",
                       help="Packed documents: a document ends after each EOD token; "
                            "attention stays inside documents and positions restart in each "
                            "(needs --micro-batch-size 1).")
    group.add_argument("--burst-document-layout", choices=DOCUMENT_LAYOUTS, default=None,
                       help="How --burst-document-mask shards the documents over the CP "
                            "group (default whole_docs; zigzag pads every document to 2*cp "
                            "and needs pipeline size 1 and no sequence parallelism).")
    return parser


# Each --burst-* option's default: a value other than this is the user asking for something.
OPTION_DEFAULTS = {"burst_backward": "auto", "burst_intra_node_size": None,
                   "burst_ulysses_size": None, "burst_profile": None,
                   "burst_remat_aware": False, "burst_document_mask": False,
                   "burst_document_layout": None}


def refuse_ignored_options(args: argparse.Namespace) -> None:
    """Raise ValueError for a --burst-* option that would change nothing in this run.

    Without BurstAttention no --burst-* option does anything; --burst-profile is read only
    by 'auto' choices. (Each option's own misuse is checked where it is applied.)
    """
    given = [name for name, default in OPTION_DEFAULTS.items()
             if getattr(args, name, default) != default]
    flags = ", ".join("--" + name.replace("_", "-") for name in given)
    if given and not uses_burst(args):
        raise ValueError(f"{flags} need BurstAttention (--cp-comm-type burst or a2a+burst), "
                         f"got --cp-comm-type {args.cp_comm_type}")
    autos = [getattr(args, name, None) for name in
             ("burst_backward", "burst_intra_node_size", "burst_ulysses_size")]
    if getattr(args, "burst_profile", None) and "auto" not in autos:
        raise ValueError("--burst-profile is read only by 'auto' choices; --burst-backward, "
                         "--burst-intra-node-size and --burst-ulysses-size are all fixed here")


def _int_or_auto(text: str):
    """argparse type: a positive count, or 'auto'."""
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer or 'auto', got {text!r}") from None


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
    if getattr(args, "burst_remat_aware", False) and getattr(
            args, "recompute_granularity", None) != "full":
        raise ValueError("--burst-remat-aware keeps attention's output for the full recompute; "
                         "it does nothing without --recompute-granularity full")
    return layout


def apply_burst_args(args: argparse.Namespace, config: Any,
                     layout: Optional[CPLayout] = None) -> CPLayout:
    """Put the run's layout on `config` (a TransformerConfig, or one that proxies it)."""
    layout = layout or burst_layout_from_args(args)
    config.burst_layout = layout
    config.burst_remat_aware = bool(getattr(args, "burst_remat_aware", False))
    return layout


def document_layout_from_args(args: argparse.Namespace) -> Optional[str]:
    """The layout of document batches, or None without --burst-document-mask.

    Raises ValueError for settings the document path cannot honour, and for Megatron's
    --reset-attention-mask / --reset-position-ids without it: the entry point builds no
    dense mask, and GPTModel's RoPE ignores position_ids, so they would do nothing.
    """
    if not args.burst_document_mask:
        _refuse_ignored_document_flags(args)
        return None
    layout = args.burst_document_layout or DOCUMENT_LAYOUTS[0]
    if not uses_burst(args):
        raise ValueError(f"--burst-document-mask needs BurstAttention (--cp-comm-type burst "
                         f"or a2a+burst), got --cp-comm-type {args.cp_comm_type}")
    if args.micro_batch_size != 1:
        raise ValueError(f"--burst-document-mask packs documents into one sequence per micro "
                         f"batch: it needs --micro-batch-size 1, got {args.micro_batch_size}")
    if layout == "zigzag" and (args.pipeline_model_parallel_size > 1 or args.sequence_parallel):
        # Zigzag pads each document to a multiple of 2*cp, so a rank's length changes from
        # batch to batch; pipeline sends and sequence-parallel splits need a fixed s/cp.
        raise ValueError("--burst-document-layout zigzag needs --pipeline-model-parallel-size "
                         "1 and no --sequence-parallel; use whole_docs (every rank holds s/cp)")
    return layout


def _refuse_ignored_document_flags(args: argparse.Namespace) -> None:
    if getattr(args, "burst_document_layout", None) is not None:
        raise ValueError("--burst-document-layout needs --burst-document-mask")
    if getattr(args, "reset_attention_mask", False):
        raise ValueError("--reset-attention-mask: this entry point builds no dense [s, s] "
                         "mask; use --burst-document-mask for documents split at EOD")
    if (getattr(args, "reset_position_ids", False)
            and getattr(args, "position_embedding_type", "rope") == "rope"):
        raise ValueError("--reset-position-ids: megatron-core's GPTModel ignores position_ids "
                         "for RoPE; use --burst-document-mask, which restarts RoPE positions "
                         "in every document")
