"""The BurstAttention options, described once, and the one resolver that decides 'auto'.

``BurstOptions`` is the schema of every knob a user sets: what ``burst_attn`` takes as
keywords, what the ``--burst-*`` flags, the YAML ``burst:`` keys and the spec provider's
keywords are derived from (``OPTION_FIELDS``), each value spelled one way: a flat ring is
``intra_node_size=None`` everywhere (YAML ``null``; a count of 1 rank per node is a flat
ring too), 'auto' means the time model decides.

``resolve`` is the only function that turns options into a decided ``CPTopology``: it is
where 'auto' (backward mode, Ulysses split, double ring) is settled, by the time model
(``timing``) with the cluster's profile, and where ranks per node come from
(``cp_ranks_per_node``). Every entry point calls it once and hands the value down.
"""
from __future__ import annotations

import dataclasses
import functools
import logging
import os
from typing import Any, Sequence

from .cp_topology import BACKWARD_MODES, CPTopology, HeadShape
from .placement import DOCUMENT_LAYOUTS
from .timing import PROFILE_ENV, choose, load_profile

logger = logging.getLogger(__name__)

AUTO = "auto"


def _option(default: Any, help: str, *, choices: Sequence[str] | None = None,
            auto: bool = False) -> Any:
    return dataclasses.field(default=default, metadata=dict(help=help, choices=choices,
                                                            auto=auto))


@dataclasses.dataclass(frozen=True)
class BurstOptions:
    """What a user can ask of BurstAttention (see the module docstring)."""

    backward: str = _option(
        AUTO, "Backward ring: 'burst' moves Q/dO/dQ, 'ring' moves K/V/dK/dV; 'auto': the "
        "time model picks the faster for the layer's shape.", choices=BACKWARD_MODES)
    ulysses_size: int | str = _option(
        1, "Ranks that split heads by all-to-all before the ring, or 'auto' (the time "
        "model picks the split).", auto=True)
    intra_node_size: int | str | None = _option(
        None, "CP ranks per node for the topology-aware double ring, counted in ranks "
        "(Ulysses ranks included); unset: a flat ring; 'auto': the time model decides.",
        auto=True)
    profile: str | None = _option(
        None, "The cluster profile the time model reads for 'auto': a file written by "
        "`megatron-burst tune`, or a shipped name (h200-nvlink, a100-ib); default "
        "$MEGATRON_BURST_PROFILE, else h200-nvlink.")
    remat_aware: bool = _option(
        False, "With full recompute: keep each layer's attention output and lse from the "
        "first forward, so the recompute skips the attention ring.")
    document_mask: bool = _option(
        False, "Packed documents: a document ends after each EOD token; attention stays "
        "inside documents and positions restart in each (needs micro batch size 1).")
    document_layout: str | None = _option(
        None, "How document masks shard the documents over the CP group (default "
        "whole_docs; zigzag pads every document to 2*cp).", choices=DOCUMENT_LAYOUTS)

    def checked(self) -> "BurstOptions":
        """Raise ValueError naming the option whose value is not one it takes."""
        for f in dataclasses.fields(self):
            value, meta = getattr(self, f.name), f.metadata
            if meta["choices"] and value is not None and value not in meta["choices"]:
                raise ValueError(f"{f.name} must be one of {tuple(meta['choices'])}, got "
                                 f"{value!r}")
            if meta["auto"] and value is not None and value != AUTO and not (
                    isinstance(value, int) and not isinstance(value, bool) and value >= 1):
                raise ValueError(f"{f.name} must be a positive int or 'auto', got {value!r}")
        for name in ("remat_aware", "document_mask"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be true or false, got {getattr(self, name)!r}")
        if self.profile is not None and AUTO not in (self.backward, self.ulysses_size,
                                                     self.intra_node_size):
            raise ValueError("profile is read only by 'auto' choices; backward, "
                             "intra_node_size and ulysses_size are all fixed here")
        return self


OPTION_FIELDS = tuple(dataclasses.fields(BurstOptions))


def remat_problem(remat_aware: bool, recompute: str | None) -> str | None:
    """Why ``remat_aware`` cannot be honoured with this recompute setting, or None."""
    if remat_aware and recompute != "full":
        return (f"remat-aware recompute keeps attention's output for the full recompute; it "
                f"does nothing with recompute {recompute or 'off'} (needs full)")
    return None
# The options that shape the CP topology (the rest shape the run around it).
TOPOLOGY_OPTIONS = ("backward", "ulysses_size", "intra_node_size", "profile")


def resolve(options: BurstOptions, *, cp: int, heads: HeadShape, tokens: int,
            cp_ranks_per_node: int | None, causal: bool = True) -> CPTopology:
    """The decided topology for a CP group of ``cp`` ranks (``tokens`` per rank: batch x
    local sequence; ``cp_ranks_per_node``: ranks of the group on one node, None: all)."""
    options.checked()
    profile = options.profile or os.environ.get(PROFILE_ENV)  # part of the cache's key
    return _resolve(cp, heads, tokens, cp_ranks_per_node, bool(causal), options.backward,
                    options.ulysses_size, options.intra_node_size, profile)


def fixed_topology(options: BurstOptions, *, cp: int, heads: HeadShape) -> CPTopology:
    """What the options fix, built (so validated) with 'auto' read as the plainest choice:
    a bad value is named even where 'auto' leaves the rest to the time model."""
    return CPTopology.build(
        cp, ulysses=1 if options.ulysses_size == AUTO else options.ulysses_size,
        ranks_per_node=None if options.intra_node_size == AUTO else options.intra_node_size,
        backward="burst" if options.backward == AUTO else options.backward, heads=heads)


def check_decided(topology: CPTopology, options: BurstOptions, *, cp: int,
                  heads: HeadShape) -> CPTopology:
    """A topology decided elsewhere (once per run), checked where it is used: made for this
    group and these heads (element size aside: it only weighs the time model's choice), and
    doing what ``options`` fix ('auto' and unset options fix nothing)."""
    made_for = None if topology.heads is None else (
        topology.heads.hq, topology.heads.hkv, topology.heads.head_dim)
    if topology.cp != cp or made_for not in (None, (heads.hq, heads.hkv, heads.head_dim)):
        raise ValueError(f"topology was resolved for cp={topology.cp} and heads "
                         f"{topology.heads}, but here cp={cp} and heads are {heads}")
    options.checked()
    asked = {name: value for name, value, unset in (
        ("backward", options.backward, AUTO), ("ulysses", options.ulysses_size, 1),
        ("ranks_per_node", options.intra_node_size, None)) if value not in (AUTO, unset)}
    if asked:
        held = dict(ulysses=topology.ulysses, ranks_per_node=topology.ranks_per_node,
                    backward=topology.backward)
        try:
            same = CPTopology.build(cp, **{**held, **asked}, heads=topology.heads) == topology
        except ValueError:
            same = False
        if not same:
            raise ValueError(f"the topology given ({topology.describe()}) does not do what "
                             f"the options fix: {asked}")
    return topology


@functools.lru_cache(maxsize=256)  # every layer of a model, and every call, asks alike
def _resolve(cp: int, heads: HeadShape, tokens: int, cp_ranks_per_node: int | None,
             causal: bool, backward: str, ulysses: int | str, per_node: int | str | None,
             profile: str | None) -> CPTopology:
    fixed = fixed_topology(BurstOptions(backward=backward, ulysses_size=ulysses,
                                        intra_node_size=per_node), cp=cp, heads=heads)
    if AUTO not in (backward, ulysses, per_node):
        return fixed
    ranked = choose(cp, heads, tokens=tokens, causal=causal, prof=load_profile(profile),
                    cp_ranks_per_node=cp_ranks_per_node,
                    ulysses=AUTO if ulysses == AUTO else fixed.ulysses,
                    ranks_per_node=AUTO if per_node == AUTO else fixed.ranks_per_node,
                    backward=backward)
    logger.info("burst auto (%d tokens per rank, %s, profile %s): %s", tokens,
                "causal" if causal else "full", load_profile(profile).name,
                ranked[0].describe())
    return ranked[0].layout


def cp_ranks_per_node(cp: int, *, gpus_per_node: int | None, tp: int = 1,
                      group_ranks: Sequence[int] | None = None,
                      rank: int | None = None) -> int | None:
    """How many ranks of a CP group share a node (None: unknown, taken as all of them).

    With the group's global ranks (and this rank's), counted exactly, nodes being
    ``gpus_per_node`` consecutive global ranks; without them, Megatron's rank order (TP
    innermost, then CP) gives ``gpus_per_node / tp`` of the group per node.
    """
    if not gpus_per_node or gpus_per_node <= 0:
        return None
    if group_ranks is not None and rank is not None:
        node = rank // gpus_per_node
        return sum(1 for r in group_ranks if r // gpus_per_node == node)
    return max(1, min(cp, gpus_per_node // max(tp, 1)))


def local_gpus() -> int | None:
    """Ranks per node as torchrun says (LOCAL_WORLD_SIZE), or None outside torchrun."""
    local = int(os.environ.get("LOCAL_WORLD_SIZE", "0"))
    return local if local > 0 else None


