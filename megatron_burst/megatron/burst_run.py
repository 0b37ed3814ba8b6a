"""A Megatron run's BurstAttention choices, made once at start-up and kept for the run.

It exists so that both ways into Megatron's training loop (this package's
`megatron_burst.megatron.pretrain_gpt` and Megatron-LM's own `pretrain_gpt.py` with
`patches/` applied) make every choice in one place: `configure_run` checks the --burst-*
options against Megatron's (refusing what the run could not honour, `run_checks`), turns off
the dataloader's dense [s, s] attention mask (BurstAttention never reads it), resolves the
run's CP topology once and binds it, with the remat choice, into the burst layer spec (every
layer gets them as the spec's params), makes every model chunk a `DocumentGPTModel` for
document masks, switches on the link emulator when $MEGATRON_BURST_EMULATE asks, and prints
one line per choice. The run it made is kept (`configured_topology`) for the document
batches' ring plans (`run_batches`).
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, List, Optional

from megatron_burst.decide.topology import CPTopology
from megatron_burst.comm.emulator import install_from_env
from megatron_burst.megatron import prefetch
from megatron_burst.megatron.arguments import (
    burst_checks,
    document_layout_from_args,
    mask_builder_from_args,
    refuse_ignored_options,
    uses_burst,
)
from megatron_burst.megatron.printer import say
from megatron_burst.megatron.run_checks import refuse_unhonoured
from megatron_burst.megatron.resolve import topology_from_args


@dataclasses.dataclass(frozen=True)
class BurstRun:
    """What a run does with BurstAttention (topology None and not ``decided_later``: it does
    not use it)."""

    topology: Optional[CPTopology]
    documents: Optional[str]  # the document batch layout, None without document masks
    remat_aware: bool = False
    dense_mask_off: bool = False  # --create-attention-mask-in-dataloader turned off here
    mask_builder: Optional[str] = None  # --burst-mask-builder: a slice mask per micro-batch
    # 'auto' waits for this machine's profile: each layer decides at its first call
    # (`machine_profile`), the topology here stays None.
    decided_later: bool = False
    # pack_zigzag: the most documents a batch holds (its boundaries padded to it); None: each
    # batch's own power of two
    document_capacity: Optional[int] = None

    @property
    def uses_burst(self) -> bool:
        return self.topology is not None or self.decided_later

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
        """One line per choice, for rank 0 to print."""
        if not self.uses_burst:
            return []
        lines = [f"BurstAttention context parallelism: {self.topology.describe()}"
                 if self.topology is not None else
                 "BurstAttention context parallelism: 'auto', decided at the first call from "
                 "this machine's profile, measured then (none is cached yet)"]
        if self.documents:
            lines.append(f"document masks: documents end after each EOD token, attention "
                         f"stays inside them, RoPE positions restart in each; sharded "
                         f"{self.documents} over the CP group")
            ahead = ("made two micro-batches ahead on a background thread"
                     if prefetch.enabled() else "made on the step ($MEGATRON_BURST_PREFETCH=0)")
            lines.append(f"document batches (shards, pack, ring plans): {ahead}")
        if self.mask_builder:
            lines.append(f"slice masks: {self.mask_builder} makes each micro-batch's mask; "
                         f"the batch is sharded by mask area, RoPE at its positions")
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
    install_from_env()  # $MEGATRON_BURST_EMULATE: slow links between virtual nodes
    refuse_ignored_options(args)
    if not uses_burst(args):  # Megatron's own CP modes: nothing here is ours to check
        return BurstRun(None, None)
    documents = document_layout_from_args(args)
    mask_builder = mask_builder_from_args(args)
    refuse_unhonoured(args, documents)
    burst_checks(args)
    topology = topology_from_args(args)
    dense_off = bool(getattr(args, "create_attention_mask_in_dataloader", False))
    if dense_off:
        args.create_attention_mask_in_dataloader = False
    run = BurstRun(topology, documents, bool(getattr(args, "burst_remat_aware", False)),
                   dense_off, mask_builder, decided_later=topology is None,
                   document_capacity=getattr(args, "burst_document_capacity", None))
    if model_cfg is not None:
        model_cfg.transformer_layer_spec = run.bind_spec(model_cfg.transformer_layer_spec)
        if documents or mask_builder:
            from megatron_burst.megatron.document_model import document_models

            # GPTModelBuilder constructs GPTModel itself: make each chunk a DocumentGPTModel.
            model_cfg.pre_wrap_hooks.append(document_models)
    for line in run.describe():
        say(f"> {line}")
    _CONFIGURED[:] = [run]
    return run


_CONFIGURED: List[BurstRun] = []  # the run configure_run made (its topology feeds the plans)


def configured_topology() -> Optional[CPTopology]:
    """The topology of the run `configure_run` made in this process (None: none made)."""
    return _CONFIGURED[0].topology if _CONFIGURED else None
