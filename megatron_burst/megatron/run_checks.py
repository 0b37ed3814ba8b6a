"""What a Megatron run with BurstAttention cannot honour, refused before it trains.

It exists so that a flag the run would silently drop, or a combination known to fail later
(a CUDA graph that cannot replay host decisions, a checkpoint whose optimizer state cannot
be resumed), stops the run at start-up with one line naming it, on every rank and before
any communication. `refuse_unhonoured` is what `burst_run.configure_run` asks of every
run with BurstAttention; `check_own_entry` what this package's own entry point
(`megatron_burst.megatron.pretrain_gpt`) adds, with or without it.
"""
from __future__ import annotations

from typing import Any, Optional

from megatron_burst.comm.settings import AGREE_ENV, HOST_CHANNEL_ENV, REPLAY_ENV, current
from megatron_burst.megatron.arguments import refuse_dense_mask_flags
from megatron_burst.plan.layouts import PACK_ZIGZAG

# Megatron options whose batches the document path cannot build: each would be dropped.
_DOCUMENT_CONFLICTS = (
    ("sft", "--sft (its THD batches carry their own boundaries)"),
    ("fim_data", "--fim-data"),
    ("mtp_num_layers", "--mtp-num-layers"),
    ("dataloader_inter_document_masking", "--dataloader-inter-document-masking"),
)

# What this package's entry point (megatron_burst.megatron.pretrain_gpt) cannot build in any
# CP mode: its datasets are GPTDataset / MockGPTDataset only, its model has no MTP block, and
# its loss is the token loss (no offline distillation from cached teacher logits).
_OWN_ENTRY_LACKS = (("sft", "--sft", "builds GPT datasets only"),
                    ("fim_data", "--fim-data", "builds GPT datasets only"),
                    ("mtp_num_layers", "--mtp-num-layers", "builds no multi-token prediction "
                                                           "block"),
                    ("logits_load_dir", "--logits-load-dir", "trains on the token loss only "
                                                             "(no distillation loss)"))


def refuse_unhonoured(args: Any, documents: Optional[str]) -> None:
    """Raise ValueError naming the flag for what a BurstAttention run could not honour
    (``documents``: the document batch layout, None without document masks)."""
    if getattr(args, "hybrid_context_parallel", False):
        raise ValueError("--hybrid-context-parallel gives each sample its own CP group; "
                         "BurstAttention runs one ring over the model's CP group")
    if getattr(args, "dataloader_inter_document_masking", False) and not documents:
        raise ValueError("--dataloader-inter-document-masking with BurstAttention: use "
                         "--burst-document-mask (documents from EOD, sharded whole_docs)")
    if getattr(args, "use_gloo_process_groups", True) is False \
            and current().host_channel == "gloo":
        raise ValueError(f"--disable-gloo-process-groups: BurstAttention's ranks trade what "
                         f"their hosts read over gloo twins of their groups ({HOST_CHANNEL_ENV}"
                         f"=gloo, the default); set {HOST_CHANNEL_ENV}=group to keep that on "
                         f"the NCCL groups")
    refuse_failing_resume(args)
    check_cuda_graphs(args, documents)
    if documents:
        for name, conflict in _DOCUMENT_CONFLICTS:
            if getattr(args, name, None):
                raise ValueError(f"--burst-document-mask cannot be combined with {conflict}")


def check_own_entry(args: Any) -> None:
    """Raise ValueError for Megatron flags this package's entry point would ignore, with or
    without BurstAttention: datasets, model parts and losses it does not build, and
    (without document masks) --reset-* flags, since it builds no dense mask and GPTModel's
    RoPE ignores position_ids.
    Megatron-LM's own pretrain_gpt.py honours them without BurstAttention, so `configure_run`
    leaves such runs alone."""
    for name, option, lacks in _OWN_ENTRY_LACKS:
        if getattr(args, name, None):
            raise ValueError(f"{option}: megatron_burst.megatron.pretrain_gpt {lacks}; use "
                             f"Megatron-LM's pretrain_gpt.py with the patch")
    if not getattr(args, "burst_document_mask", False):
        refuse_dense_mask_flags(args)


def check_cuda_graphs(args: Any, documents: Optional[str]) -> None:
    """Megatron's CUDA graphs replay what they captured: fixed shapes, no host decisions."""
    impl = getattr(args, "cuda_graph_impl", None) or "none"
    if impl == "none":
        return
    if documents and (documents != PACK_ZIGZAG.name
                      or getattr(args, "burst_document_capacity", None) is None):
        raise ValueError(f"--cuda-graph-impl {impl} with --burst-document-mask: every micro-"
                         f"batch brings a new pack, with new attention shapes; a captured "
                         f"graph replays only the shapes it captured (use "
                         f"--burst-document-layout {PACK_ZIGZAG.name} with "
                         f"--burst-document-capacity: one shape for every pack)")
    if getattr(args, "burst_remat_aware", False):
        raise ValueError(f"--cuda-graph-impl {impl} with --burst-remat-aware: keeping and "
                         f"taking attention outputs is host work a graph does not replay")
    if impl != "local":
        raise ValueError(f"--cuda-graph-impl {impl}: BurstAttention layers are captured and "
                         f"checked with --cuda-graph-impl local only")
    if current().agree == "always":
        raise ValueError(f"{AGREE_ENV}=always checks every call with a collective, "
                         "which a CUDA graph cannot capture; use first (the default)")
    if current().replay != "off":  # attention.replay: refused there too, mid-run
        raise ValueError(f"{REPLAY_ENV}={current().replay} with --cuda-graph-impl {impl}: a "
                         f"capture after calls that replayed their own graphs failed on 2x "
                         f"H100; a run that captures its step replays it anyway (use off, "
                         f"the default)")


def refuse_failing_resume(args: Any) -> None:
    """Stop before training where resuming a checkpoint is known to fail: its distributed
    optimizer state with torch's Adam (megatron-core 0.19 without TransformerEngine or apex).
    What is resumed is decided as Megatron's load_checkpoint decides it (``resume``)."""
    from megatron_burst.megatron.environment import distributed_optimizer_resume_problem
    from megatron_burst.megatron.resume import optimizer_state_source

    problem = distributed_optimizer_resume_problem(
        bool(getattr(args, "use_distributed_optimizer", False)), optimizer_state_source(args))
    if problem:
        raise ValueError(problem)
