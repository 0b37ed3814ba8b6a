"""Command-line options that select BurstAttention in a Megatron run.

`add_burst_args` is an `extra_args_provider` for megatron.training: it adds one
`--burst-<name>` flag per field of `megatron_burst.decide.options.BurstOptions` (the one schema:
the flag's type, choices and help come from it). Megatron's own --cp-comm-type already
takes any string, so `--cp-comm-type burst` / `a2a+burst` parse as they are. The checks
here run on every rank before any communication: `refuse_ignored_options` (an option that
would change nothing stops the run), `burst_checks` (what the run could not honour) and
`document_layout_from_args` (the schema's rules between the options and the run, and the
document options; Megatron's --reset-* flags, which the entry point would otherwise
ignore, are refused). The options themselves are checked by the schema they are read into
(`options_from_all_args`). The run's topology is resolved once by
`megatron_burst.megatron.resolve.topology_from_args`.
"""
from __future__ import annotations

import argparse
from typing import Optional

from megatron_burst.decide.topology import COMM_TYPE_ALIASES, CPTopology
from megatron_burst.megatron.resolve import comm_types
from megatron_burst.decide.options import AUTO, OPTION_FIELDS, BurstOptions, OptionError
from megatron_burst.plan.layouts import DOCUMENT_LAYOUTS
from megatron_burst.megatron.mask_batches import FLAG as MASK_BUILDER_FLAG, load_builder

# What a user writes to ask for BurstAttention (the aliases p2p / a2a+p2p also run it when
# the burst layer spec is in place, but do not by themselves select it).
BURST_COMM_TYPES = tuple(sorted({v for v in COMM_TYPE_ALIASES.values()}))


def flag(name: str) -> str:
    """The command-line spelling of an option of the schema."""
    return "--burst-" + name.replace("_", "-")


def add_burst_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the --burst-* options (one per BurstOptions field) to a Megatron parser.

    Every flag defaults to "not given" (None, or False for switches), so that what the user
    did not set can come from Megatron's own settings (hierarchical sizes) or defaults.
    """
    group = parser.add_argument_group("BurstAttention (megatron_burst)")
    for field in OPTION_FIELDS:
        meta = field.metadata
        if field.type in ("bool", bool):
            group.add_argument(flag(field.name), action="store_true", help=meta["help"])
        elif meta["auto"]:
            group.add_argument(flag(field.name), type=_int_or_auto, default=None,
                               help=meta["help"])
        elif meta["kind"] is int:
            group.add_argument(flag(field.name), type=int, default=None, help=meta["help"])
        else:
            group.add_argument(flag(field.name), choices=meta["choices"], default=None,
                               help=meta["help"])
    # Not a BurstOptions field: burst_attn takes the mask itself (mask=); this is the data
    # path's, as Megatron's own dataset flags are.
    group.add_argument(MASK_BUILDER_FLAG, default=None, metavar="MODULE:FUNCTION",
                       help="A slice mask per micro-batch: the function gets the batch and "
                       "returns a megatron_burst.SliceMask (shipped: megatron_burst.megatron."
                       "mask_batches:documents, :prefix_lm, :shared_question); the batch is "
                       "sharded by mask area (needs micro batch size 1).")
    return parser


def mask_builder_from_args(args: argparse.Namespace) -> Optional[str]:
    """The --burst-mask-builder of the run (None without it), checked: it names a function,
    and what it cannot be combined with is refused."""
    spec = getattr(args, "burst_mask_builder", None)
    if spec is None:
        return None
    if getattr(args, "burst_document_mask", False):
        raise ValueError(f"{MASK_BUILDER_FLAG} cannot be combined with --burst-document-mask "
                         f"(the builder megatron_burst.megatron.mask_batches:documents is "
                         f"document masks as a slice mask)")
    if getattr(args, "micro_batch_size", 1) != 1:
        raise ValueError(f"{MASK_BUILDER_FLAG} makes one mask per sequence: it needs "
                         f"--micro-batch-size 1, got {args.micro_batch_size}")
    load_builder(spec)
    return spec


def refuse_ignored_options(args: argparse.Namespace) -> None:
    """Raise ValueError for a --burst-* option that would change nothing in this run.

    Without BurstAttention no --burst-* option does anything; --burst-profile is read only
    by 'auto' choices (the backward mode is 'auto' unless given). (Each option's own misuse
    is checked where it is applied.)
    """
    given = [f.name for f in OPTION_FIELDS
             if getattr(args, f"burst_{f.name}", None) not in (None, False)]
    given += ["mask_builder"] if getattr(args, "burst_mask_builder", None) else []
    flags = ", ".join(flag(name) for name in given)
    if given and not uses_burst(args):
        raise ValueError(f"{flags} need BurstAttention (--cp-comm-type burst or a2a+burst), "
                         f"got --cp-comm-type {args.cp_comm_type}")


def options_from_all_args(args: argparse.Namespace) -> BurstOptions:
    """Every --burst-* option the command line gives, as the schema's value (so checked by
    it, its rules between options included); an error names the flag."""
    values = {f.name: getattr(args, f"burst_{f.name}", None) for f in OPTION_FIELDS}
    values = {name: value for name, value in values.items() if value not in (None, False)}
    try:
        return BurstOptions.of(values)
    except OptionError as err:
        raise ValueError(err.spelled(flag)) from None


def _int_or_auto(text: str):
    """argparse type: a positive count, or 'auto'."""
    if text == AUTO:
        return text
    try:
        count = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer or 'auto', got {text!r}") from None
    if count < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer or 'auto', got {count}")
    return count


def uses_burst(args: argparse.Namespace) -> bool:
    """Whether --cp-comm-type selects BurstAttention (per-layer lists must not mix)."""
    types = comm_types(args.cp_comm_type)
    chosen = [t in BURST_COMM_TYPES for t in types]
    if any(chosen) and not all(chosen):
        raise ValueError(f"--cp-comm-type {types}: burst cannot be mixed per layer with TE modes")
    if any(chosen) and len(set(types)) > 1:
        raise ValueError(f"--cp-comm-type {types}: give one BurstAttention mode for all layers")
    return all(chosen)


def burst_checks(args: argparse.Namespace) -> None:
    """Raise ValueError for Megatron settings a BurstAttention run cannot honour."""
    cp = args.context_parallel_size
    if cp < 1:
        raise ValueError("--cp-comm-type burst needs --context-parallel-size >= 1")
    divisor = CPTopology.seq_len_divisor(cp)
    if args.seq_length % divisor:
        raise ValueError(f"--seq-length {args.seq_length} is not divisible by 2*cp = {divisor}")
    if args.attention_dropout:
        raise ValueError(f"BurstAttention has no attention dropout; pass --attention-dropout 0 "
                         f"(got {args.attention_dropout})")


# Where the schema's rule names a run setting, the Megatron flag that sets it.
_MEGATRON_SPELLING = {"remat_aware": " (--recompute-granularity full)",
                      "document_mask": " (--micro-batch-size 1)",
                      "document_layout": " (--pipeline-model-parallel-size, "
                                         "--sequence-parallel)"}


def run_rules(args: argparse.Namespace) -> None:
    """Raise ValueError where the --burst-* options cannot do what they say in this run, by
    the schema's rules (``BurstOptions.run_problem``), naming the flags."""
    problem = options_from_all_args(args).run_problem(
        micro_batch_size=args.micro_batch_size,
        pipeline=getattr(args, "pipeline_model_parallel_size", 1),
        sequence_parallel=bool(getattr(args, "sequence_parallel", False)),
        recompute=getattr(args, "recompute_granularity", None))
    if problem:
        raise ValueError(problem.spelled(flag) + _MEGATRON_SPELLING.get(problem.option, ""))


def document_layout_from_args(args: argparse.Namespace) -> Optional[str]:
    """The layout of document batches, or None without --burst-document-mask, once the
    schema's rules hold for the run (``run_rules``).

    Raises ValueError for settings the document path cannot honour, and for Megatron's
    --reset-attention-mask / --reset-position-ids without it: the entry point builds no
    dense mask, and GPTModel's RoPE ignores position_ids, so they would do nothing.
    """
    if not args.burst_document_mask:
        refuse_dense_mask_flags(args)
    elif not uses_burst(args):
        raise ValueError(f"--burst-document-mask needs BurstAttention (--cp-comm-type burst "
                         f"or a2a+burst), got --cp-comm-type {args.cp_comm_type}")
    run_rules(args)
    if not args.burst_document_mask:
        return None
    return args.burst_document_layout or DOCUMENT_LAYOUTS[0]


def refuse_dense_mask_flags(args: argparse.Namespace) -> None:
    """Megatron's --reset-* flags where no dense mask is built and RoPE ignores
    position_ids: they would do nothing (use --burst-document-mask)."""
    if getattr(args, "reset_attention_mask", False):
        raise ValueError("--reset-attention-mask: this entry point builds no dense [s, s] "
                         "mask; use --burst-document-mask for documents split at EOD")
    if (getattr(args, "reset_position_ids", False)
            and getattr(args, "position_embedding_type", "rope") == "rope"):
        raise ValueError("--reset-position-ids: megatron-core's GPTModel ignores position_ids "
                         "for RoPE; use --burst-document-mask, which restarts RoPE positions "
                         "in every document")
