"""What both ways into Megatron's training loop share, so that they cannot diverge.

This package's entry point (`megatron_burst.megatron.pretrain_gpt`) and Megatron-LM's own
`pretrain_gpt.py` with `patches/` applied make every BurstAttention choice here:

- `configure_run` checks the --burst-* options against Megatron's (refusing what the run
  could not honour), turns off the dataloader's dense [s, s] attention mask (BurstAttention
  never reads it; building it cost 2.5 s per iteration at 16K), resolves the run's CP
  topology once and binds it, with the remat choice, into the burst layer spec (every
  layer gets them as the spec's params), makes every model chunk a `DocumentGPTModel` for
  document masks, switches on the link emulator when $MEGATRON_BURST_EMULATE asks, and
  prints one line per choice;
- with document masks every rank reads the data (`dataset_on_every_rank`) and
  `document_batch` makes each micro-batch: boundaries from EOD, positions restarted per
  document, tokens, labels, loss mask and positions sharded with the attention's layout, and
  the `DocumentParams` the layers read, its pack's ring plans made, all off the step on the
  data path's background thread (`prefetch`);
- the FLOPs the run does (its padded vocabulary, documents, recompute) are counted by
  `run_flops` and printed on rank 0 in the line the benchmarks read (`flops.read_flops`).
"""
from __future__ import annotations

import dataclasses
import functools
import os
from typing import Any, Iterator, List, Optional, Tuple

import torch
import torch.distributed as dist

from megatron_burst.topology import CPTopology
from megatron_burst.link_emulation import maybe_emulate_links
from megatron_burst.megatron.arguments import (
    burst_checks,
    document_layout_from_args,
    refuse_dense_mask_flags,
    refuse_ignored_options,
    uses_burst,
)
from megatron_burst.flops import flops_line
from megatron_burst.megatron import prefetch
from megatron_burst.megatron.document_batches import DocumentBatches, DocumentBatchMaker
from megatron_burst.megatron.pack_plans import targets_from_args
from megatron_burst.megatron.run_flops import FlopsCounter, layer_windows
from megatron_burst.megatron.resolve import topology_from_args
from megatron_burst.megatron.trace import StepTrace
from megatron_burst.placement import DOCUMENT_LAYOUTS

# Megatron options whose batches the document path cannot build: each would be dropped.
_DOCUMENT_CONFLICTS = (
    ("sft", "--sft (its THD batches carry their own boundaries)"),
    ("fim_data", "--fim-data"),
    ("mtp_num_layers", "--mtp-num-layers"),
    ("dataloader_inter_document_masking", "--dataloader-inter-document-masking"),
)


@dataclasses.dataclass(frozen=True)
class BurstRun:
    """What a run does with BurstAttention (topology None: it does not use it)."""

    topology: Optional[CPTopology]
    document_layout: Optional[str]  # how document batches are placed; None: no document masks
    remat_aware: bool = False
    dense_mask_off: bool = False  # --create-attention-mask-in-dataloader turned off here

    @property
    def layer_spec_kwargs(self) -> dict:
        """What the burst spec functions take to hand this run's choices to every layer."""
        return dict(topology=self.topology, remat_aware=self.remat_aware)

    def bind_spec(self, spec: Any) -> Any:
        """The run's layer spec with the topology and remat bound in: the burst spec where
        none is given, or the given one when it is one of ours (`--spec ...burst_spec`).
        A spec of another kind cannot take them, so it is refused."""
        from megatron_burst.megatron import spec as burst_spec

        if spec is None:
            spec = burst_spec.get_gpt_layer_burst_spec
        base = spec.func if isinstance(spec, functools.partial) else spec
        if base in (burst_spec.get_gpt_layer_burst_spec, burst_spec.get_llama_layer_burst_spec):
            return functools.partial(spec, **self.layer_spec_kwargs)
        raise ValueError(
            f"the layer spec {getattr(spec, '__name__', type(spec).__name__)} cannot take the "
            f"run's BurstAttention topology: use --spec megatron_burst.megatron.spec "
            f"get_gpt_layer_burst_spec (or get_llama_layer_burst_spec), or build your layers "
            f"with megatron_burst.megatron.spec.BurstSpecProvider(topology=...)")

    def describe(self) -> List[str]:
        if self.topology is None:
            return []
        lines = [f"BurstAttention context parallelism: {self.topology.describe()}"]
        if self.document_layout:
            lines.append(f"document masks: documents end after each EOD token, attention "
                         f"stays inside them, RoPE positions restart in each; sharded "
                         f"{self.document_layout} over the CP group")
            ahead = ("made two micro-batches ahead on a background thread"
                     if prefetch.enabled() else "made on the step ($MEGATRON_BURST_PREFETCH=0)")
            lines.append(f"document batches (shards, pack, ring plans): {ahead}")
        if self.remat_aware:
            lines.append("remat-aware recompute: each layer keeps its attention output from "
                         "the first forward; the recompute rebuilds attention from it, no ring")
        if self.dense_mask_off:
            lines.append("the dataloader builds no dense [s, s] attention mask (BurstAttention "
                         "never reads it): --create-attention-mask-in-dataloader turned off")
        return lines


def configure_run(args: Any, model_cfg: Any = None) -> BurstRun:
    """Check and apply the --burst-* options (see the module docstring).

    The run's topology is resolved once here (`topology_from_args`) and handed to every
    attention layer through the layer spec's params: `model_cfg` (megatron-core 0.17+'s
    model config) gets the burst spec bound to it; a caller that builds the model itself
    (megatron-core < 0.17) passes `run.layer_spec_kwargs` to the spec function.
    Raises ValueError naming the option for anything the run could not honour.
    """
    maybe_emulate_links()  # $MEGATRON_BURST_EMULATE: slow links between virtual nodes
    refuse_ignored_options(args)
    if not uses_burst(args):  # Megatron's own CP modes: nothing here is ours to check
        return BurstRun(None, None)
    document_layout = document_layout_from_args(args)
    if getattr(args, "hybrid_context_parallel", False):
        raise ValueError("--hybrid-context-parallel gives each sample its own CP group; "
                         "BurstAttention runs one ring over the model's CP group")
    if getattr(args, "dataloader_inter_document_masking", False) and not document_layout:
        raise ValueError("--dataloader-inter-document-masking with BurstAttention: use "
                         "--burst-document-mask (documents from EOD, sharded whole_docs)")
    _refuse_failing_resume(args)
    _check_cuda_graphs(args, document_layout)
    if document_layout:
        for name, conflict in _DOCUMENT_CONFLICTS:
            if getattr(args, name, None):
                raise ValueError(f"--burst-document-mask cannot be combined with {conflict}")
    burst_checks(args)
    topology = topology_from_args(args)
    dense_off = bool(getattr(args, "create_attention_mask_in_dataloader", False))
    if dense_off:
        args.create_attention_mask_in_dataloader = False
    run = BurstRun(topology, document_layout, bool(getattr(args, "burst_remat_aware", False)),
                   dense_off)
    if model_cfg is not None:
        model_cfg.transformer_layer_spec = run.bind_spec(model_cfg.transformer_layer_spec)
        if document_layout:
            from megatron_burst.megatron.document_model import document_models

            # GPTModelBuilder constructs GPTModel itself: make each chunk a DocumentGPTModel.
            model_cfg.pre_wrap_hooks.append(document_models)
    for line in run.describe():
        say(f"> {line}")
    _CONFIGURED[:] = [run]
    return run


_CONFIGURED: List[BurstRun] = []  # the run configure_run made (its topology feeds the plans)


# What this package's entry point (megatron_burst.megatron.pretrain_gpt) cannot build in any
# CP mode: its datasets are GPTDataset / MockGPTDataset only.
_OWN_ENTRY_DATASETS = (("sft", "--sft"), ("fim_data", "--fim-data"))


def check_own_entry(args: Any) -> None:
    """Raise ValueError for Megatron flags this package's entry point would ignore, with or
    without BurstAttention: datasets it does not build, and (without document masks)
    --reset-* flags, since it builds no dense mask and GPTModel's RoPE ignores position_ids.
    Megatron-LM's own pretrain_gpt.py honours them without BurstAttention, so `configure_run`
    leaves such runs alone."""
    for name, option in _OWN_ENTRY_DATASETS:
        if getattr(args, name, False):
            raise ValueError(f"{option}: megatron_burst.megatron.pretrain_gpt builds GPT "
                             f"datasets only; use Megatron-LM's pretrain_gpt.py with the patch")
    if not getattr(args, "burst_document_mask", False):
        refuse_dense_mask_flags(args)


def _check_cuda_graphs(args: Any, document_layout: Optional[str]) -> None:
    """Megatron's CUDA graphs replay what they captured: fixed shapes, no host decisions."""
    impl = getattr(args, "cuda_graph_impl", None) or "none"
    if impl == "none":
        return
    if document_layout:
        raise ValueError(f"--cuda-graph-impl {impl} with --burst-document-mask: every micro-"
                         f"batch brings a new pack, with new attention shapes; a captured "
                         f"graph replays only the shapes it captured")
    if getattr(args, "burst_remat_aware", False):
        raise ValueError(f"--cuda-graph-impl {impl} with --burst-remat-aware: keeping and "
                         f"taking attention outputs is host work a graph does not replay")
    if impl != "local":
        raise ValueError(f"--cuda-graph-impl {impl}: BurstAttention layers are captured and "
                         f"checked with --cuda-graph-impl local only")
    if os.environ.get("MEGATRON_BURST_AGREE", "first").strip().lower() == "always":
        raise ValueError("MEGATRON_BURST_AGREE=always checks every call with a collective, "
                         "which a CUDA graph cannot capture; use first (the default)")


def _refuse_failing_resume(args: Any) -> None:
    """Stop before training where resuming a checkpoint is known to fail: its distributed
    optimizer state with torch's Adam (megatron-core 0.19 without TransformerEngine or apex).
    What is resumed is decided as Megatron's load_checkpoint decides it (``resume``)."""
    from megatron_burst.environment import distributed_optimizer_resume_problem
    from megatron_burst.megatron.resume import optimizer_state_source

    problem = distributed_optimizer_resume_problem(
        bool(getattr(args, "use_distributed_optimizer", False)), optimizer_state_source(args))
    if problem:
        raise ValueError(problem)


def dataset_on_every_rank(args: Any) -> bool:
    """Whether every rank needs the dataset: document batches are made on every tensor and
    pipeline rank (middle stages need the boundaries and positions too)."""
    return bool(getattr(args, "burst_document_mask", False))


def document_batch(data_iterator: Iterator, args: Any) -> Tuple[Any, ...]:
    """(tokens, labels, loss_mask, position_ids, packed_seq_params) of the next micro-batch.

    Made by ``document_batches.DocumentBatchMaker``: sharded on the host, where the
    dataloader leaves the sample, so only this rank's rows go to the GPU and the boundaries
    never need a device read; the pack's ring plans made for the run's layers. Made two
    micro-batches ahead on a background thread (``prefetch``; $MEGATRON_BURST_PREFETCH=0
    makes them here instead) under Megatron's RerunDataIterator; this step only copies them
    to the GPU from pinned memory. The documents' lengths also go to Megatron's FLOPs count
    where it keeps one (0.19+), and to this package's (``run_flops``), printed every few packs.
    """
    batches = _document_batches(args)
    _trace().step()
    source = data_iterator
    if prefetch.enabled():
        source = prefetch.prefetching(data_iterator, batches.maker.ahead, batches.agree_group)
    return batches.take(next(source))


_BATCHES: List[Any] = []  # [(args, CP group, DocumentBatches)]: the run's, made once


def _document_batches(args: Any) -> DocumentBatches:
    """The run's document batches (maker, FLOPs report, device), made at the first call and
    again only if the run's arguments or CP group are other objects (a new run in-process)."""
    from megatron.core import parallel_state
    from megatron.training import get_tokenizer

    group = parallel_state.get_context_parallel_group()
    if _BATCHES and _BATCHES[0][0] is args and _BATCHES[0][1] is group:
        return _BATCHES[0][2]
    layout = args.burst_document_layout or DOCUMENT_LAYOUTS[0]
    topology = _CONFIGURED[0].topology if _CONFIGURED else None
    targets = targets_from_args(layout, layer_windows(args), topology, group)
    maker = DocumentBatchMaker(get_tokenizer().eod, group, layout, targets,
                               FlopsCounter(args), pin=torch.cuda.is_available())
    # A batch that fails on one rank stops every rank that would wait for it: its CP peers
    # in the ring, and its TP peers (they read the same samples) in the layers' collectives.
    agree = parallel_state.get_tensor_and_context_parallel_group(check_initialized=False)
    batches = DocumentBatches(maker, _device(), say, agree or group, _megatron_seqlen_stats())
    _BATCHES[:] = [(args, group, batches)]
    return batches


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


def _device() -> torch.device:
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")  # CPU ranks (tests): the batch stays where it is


def _megatron_seqlen_stats() -> Optional[Any]:
    """Megatron's per-iteration sum of L and L^2 (0.19+, on the device), or None."""
    if not torch.cuda.is_available():
        return None
    try:
        from megatron.training.training import update_seqlen_stats_from_cu_seqlens
    except ImportError:  # before 0.19 Megatron counts full causal attention regardless
        return None
    return update_seqlen_stats_from_cu_seqlens


def _trace() -> StepTrace:
    if not _TRACE:
        _TRACE.append(StepTrace.from_env(dist.get_rank() if dist.is_initialized() else 0))
    return _TRACE[0]


_TRACE: List[StepTrace] = []


def say(message: str) -> None:
    """Print on global rank 0 (torchrun's RANK before torch.distributed is initialised)."""
    rank = dist.get_rank() if dist.is_initialized() else int(os.environ.get("RANK", "0"))
    if rank == 0:
        print(message, flush=True)
