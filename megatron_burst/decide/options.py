"""The BurstAttention options, described once and valid by construction, and the one resolver.

``BurstOptions`` is the schema of every knob a user sets, each value spelled one way: a
flat ring is ``intra_node_size=None`` everywhere (YAML ``null``; a count of 1 rank per node
is a flat ring too), 'auto' means the time model decides. The ``--burst-*`` flags and the
config keys that set the options (``launch.config.schema.OPTION_KEYS``: the ``burst:`` section,
``cluster.profile``, ``data.document_*``) are made from its fields (``OPTION_FIELDS``);
the spec provider's keywords are checked against them; ``burst_attn`` takes the topology
choices as keywords of its own signature, each value checked here.

A ``BurstOptions`` cannot hold a bad value: every field and every rule between fields is
checked when it is made (``OptionError``, a ValueError naming the option). What a user did
not give is told apart from what they gave, even when the two values are equal: a field
left out holds its default and is absent from ``given`` (so ``ulysses_size=1`` passed next
to a decided topology of Ulysses 2 is a contradiction, while leaving it out is not).

``resolve`` is the only function that turns options into a decided ``CPTopology``: it is
where 'auto' (backward mode, Ulysses split, double ring) is settled, by the time model
(``timing``) with the cluster's profile. Every entry point calls it once and hands the value
down; ranks per node come from one place, ``cluster.max_intra_node_size``.
"""
from __future__ import annotations

import dataclasses
import functools
import logging
import re
from typing import TYPE_CHECKING, Any, Callable, Hashable, Mapping, Sequence

from .not_given import NOT_GIVEN, NotGiven, is_given  # noqa: F401 (re-exported)
from .topology import BACKWARD_MODES, CPTopology, HeadShape
from ..plan.layouts import DOCUMENT_LAYOUTS, layout_named
from ..comm.settings import current
from .machine import measured_when, with_emulated_links
from .loads import first_load, work_key
from .scheduled_time import predict_pack
from .timing import Profile, choose, load_profile

if TYPE_CHECKING:  # numpy and the planner: not for the launcher's light imports
    from .pack_load import PackLoad

logger = logging.getLogger(__name__)

AUTO = "auto"


class OptionError(ValueError):
    """A BurstOptions value (or combination) that cannot be honoured. ``option`` names the
    field, so each entry point can say it its own way (``--burst-x``, ``burst.x``, x=);
    other options the reason names are written ``{name}`` in it."""

    def __init__(self, option: str, reason: str):
        super().__init__(self._say(option, reason, str))
        self.option, self.reason = option, reason

    @staticmethod
    def _say(option: str, reason: str, spelling) -> str:
        names = {f.name for f in OPTION_FIELDS}
        spelled = re.sub(r"\{(\w+)\}", lambda m: spelling(m.group(1)) if m.group(1) in names
                         else m.group(0), reason)
        return f"{spelling(option)} {spelled}"

    def spelled(self, spelling) -> str:
        """The message with every option written as ``spelling(name)`` says."""
        return self._say(self.option, self.reason, spelling)


def _option(default: Any, help: str, *, choices: Sequence[str] | None = None,
            auto: bool = False, kind: type | None = None) -> Any:
    return dataclasses.field(default=NotGiven(default), metadata=dict(
        default=default, help=help, choices=choices, auto=auto, kind=kind))


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
        "first forward, so the recompute skips the attention ring.", kind=bool)
    document_mask: bool = _option(
        False, "Packed documents: a document ends after each EOD token; attention stays "
        "inside documents and positions restart in each (needs micro batch size 1).",
        kind=bool)
    document_layout: str | None = _option(
        None, "How document masks shard the documents over the CP group (default "
        "whole_docs; zigzag pads every document to 2*cp; pack_zigzag places the pack as one "
        "sequence and the GPU reads its documents, so Megatron's CUDA graphs can replay "
        "every micro-batch).", choices=DOCUMENT_LAYOUTS)
    document_capacity: int | None = _option(
        None, "With document_layout pack_zigzag: the most documents a sequence holds, its "
        "boundaries padded to it (one shape for every micro-batch: Megatron's CUDA graphs "
        "need it; more raises). Unset: each batch's power of two.", kind=int)
    # The fields set explicitly, whatever their value (filled in by __post_init__).
    given: frozenset = dataclasses.field(init=False, default=frozenset(), repr=False)

    def __post_init__(self) -> None:
        names = []
        for f in OPTION_FIELDS:
            value = getattr(self, f.name)
            if not is_given(value):
                object.__setattr__(self, f.name, f.metadata["default"])
            else:
                names.append(f.name)
                _check_field(f, value)
        object.__setattr__(self, "given", frozenset(names))
        if "profile" in self.given and self.profile is not None and AUTO not in (
                self.backward, self.ulysses_size, self.intra_node_size):
            raise OptionError("profile", "is read only by 'auto' choices; {backward}, "
                              "{intra_node_size} and {ulysses_size} are all fixed here")
        if self.document_layout is not None and not self.document_mask:
            raise OptionError("document_layout", "shards document masks: it needs "
                              "{document_mask}")
        if self.document_capacity is not None and (
                self.document_layout is None
                or layout_named(self.document_layout).places_documents):
            raise OptionError("document_capacity", "pads the boundaries of the pack_zigzag "
                              "layout: it needs {document_layout} pack_zigzag")

    @classmethod
    def of(cls, values: Mapping[str, Any]) -> "BurstOptions":
        """Options from a mapping in which None means not given (argparse, YAML, keywords)."""
        unknown = sorted(set(values) - {f.name for f in OPTION_FIELDS})
        if unknown:
            raise OptionError(unknown[0], "is not an option; the options are "
                              + ", ".join("{%s}" % f.name for f in OPTION_FIELDS))
        return cls(**{k: v for k, v in values.items() if v is not None})

    def fixes(self) -> dict[str, Any]:
        """The topology fields this asks for by value (given, and not 'auto'), by the
        names ``CPTopology.build`` takes."""
        names = {"backward": "backward", "ulysses_size": "ulysses",
                 "intra_node_size": "intra_node_size"}
        return {names[n]: getattr(self, n) for n in names
                if n in self.given and getattr(self, n) != AUTO}

    @property
    def has_auto(self) -> bool:
        return AUTO in (self.backward, self.ulysses_size, self.intra_node_size)

    def run_problem(self, *, micro_batch_size: int, pipeline: int, sequence_parallel: bool,
                    recompute: str | None) -> OptionError | None:
        """What this run's settings keep these options from doing, or None (the rules that
        need the run: micro batch, pipeline, sequence parallelism, recompute)."""
        if self.document_mask and micro_batch_size != 1:
            return OptionError("document_mask", f"packs documents into one sequence per "
                               f"micro batch: it needs micro batch size 1, got "
                               f"{micro_batch_size}")
        if (self.document_layout is not None and layout_named(self.document_layout).pads
                and (pipeline > 1 or sequence_parallel)):
            # Zigzag pads each document to its divisor, so a rank's length changes
            # from batch to batch; pipeline sends and sequence-parallel splits need s/cp.
            return OptionError("document_layout", "zigzag needs pipeline parallel size 1 "
                               "and no sequence parallelism; use whole_docs (every rank "
                               "holds s/cp)")
        problem = remat_problem(self.remat_aware, recompute)
        return OptionError("remat_aware", problem) if problem else None


def _check_field(f: dataclasses.Field, value: Any) -> None:
    """Raise OptionError unless ``value`` is one that field ``f`` takes."""
    meta = f.metadata
    if meta["kind"] is bool:
        if not isinstance(value, bool):
            raise OptionError(f.name, f"must be true or false, got {value!r}")
    elif meta["kind"] is int:
        if not (value is None or (isinstance(value, int) and not isinstance(value, bool)
                                  and value >= 1)):
            raise OptionError(f.name, f"must be a positive int or None, got {value!r}")
    elif meta["choices"] is not None:  # None only where it is the default (unset)
        if not (value is None and meta["default"] is None) and value not in meta["choices"]:
            raise OptionError(f.name, f"must be one of {tuple(meta['choices'])}, got "
                              f"{value!r}")
    elif meta["auto"]:
        none_ok = meta["default"] is None
        if not ((none_ok and value is None) or value == AUTO or (
                isinstance(value, int) and not isinstance(value, bool) and value >= 1)):
            raise OptionError(f.name, f"must be a positive int or 'auto'"
                              f"{' or None' if none_ok else ''}, got {value!r}")
    elif value is not None and not isinstance(value, str):
        raise OptionError(f.name, f"must be a string or None, got {value!r}")


OPTION_FIELDS = tuple(f for f in dataclasses.fields(BurstOptions) if f.name != "given")


def remat_problem(remat_aware: bool, recompute: str | None) -> str | None:
    """Why ``remat_aware`` cannot be honoured with this recompute setting, or None."""
    if remat_aware and recompute != "full":
        return (f"keeps attention's output for the full recompute; it does nothing with "
                f"recompute {recompute or 'off'} (needs full)")
    return None


# The options that shape the CP topology (the rest shape the run around it).
TOPOLOGY_OPTIONS = ("backward", "ulysses_size", "intra_node_size", "profile")


def resolve(options: BurstOptions, *, cp: int, heads: HeadShape, tokens: int,
            max_intra_node_size: int | None, causal: bool = True,
            machine: Profile | None = None) -> CPTopology:
    """The decided topology for a CP group of ``cp`` ranks (``tokens`` per rank: batch x
    local sequence; ``max_intra_node_size``: ranks of the group on one node, None: all, as
    ``cluster.max_intra_node_size`` gives them; ``machine``: the profile measured on this
    machine, read where no profile is named)."""
    return decide(options, cp=cp, heads=heads, tokens=tokens,
                  max_intra_node_size=max_intra_node_size, causal=causal,
                  machine=machine).topology


@dataclasses.dataclass(frozen=True)
class Decision:
    """What 'auto' decided and from what: the candidates fastest first (none where nothing
    was 'auto'), the profile, and ``key``: the decision's inputs, by value."""

    topology: CPTopology
    ranked: tuple = ()  # timing.Prediction, fastest first
    profile: Profile | None = None
    key: tuple = ()


def decide(options: BurstOptions, *, cp: int, heads: HeadShape, tokens: int,
           max_intra_node_size: int | None, causal: bool = True,
           machine: Profile | None = None,
           pack: Callable[[], PackLoad | None] | None = None,
           work: Hashable = "documents") -> Decision:
    """``resolve``'s decision with its ranking (see ``resolve``). The profile: the one
    named (``options.profile``, else ``$MEGATRON_BURST_PROFILE``), else ``machine``, else the
    shipped default; with ``$MEGATRON_BURST_EMULATE`` set its inter-node link is the
    emulated one (``machine.with_emulated_links``). ``pack``: makes the call's load
    (``pack_load``: a document pack, a window, a slice mask), called for the first call of
    a decision's key only (``loads.first_load``); ``work``: what that key holds of it beyond
    the shape (``loads.work_key``)."""
    if cp == 1 or not options.has_auto:  # nothing for the time model to say
        return Decision(fixed_topology(options, cp=cp, heads=heads))
    prof = with_emulated_links(deciding_profile(options, machine), current().emulate)
    key = (cp, heads, tokens, max_intra_node_size, bool(causal), options.backward,
           options.ulysses_size, options.intra_node_size, prof)
    key += (None if pack is None else work_key(key, work),)
    ranked = _ranked(*key[:-1], first_load(key, pack))
    return Decision(ranked[0].topology, ranked, prof, key)


def deciding_profile(options: BurstOptions, machine: Profile | None = None) -> Profile:
    """The profile 'auto' decides from: the one named (``options.profile``, else
    ``$MEGATRON_BURST_PROFILE``), else ``machine`` (this machine's), else the shipped default."""
    named = options.profile or current().profile
    return machine if machine is not None and not named else load_profile(named)


def fixed_topology(options: BurstOptions, *, cp: int, heads: HeadShape) -> CPTopology:
    """What the options fix, built (so validated) with 'auto' read as the plainest choice:
    a bad value is named even where 'auto' leaves the rest to the time model."""
    return CPTopology.build(
        cp, ulysses=1 if options.ulysses_size == AUTO else options.ulysses_size,
        intra_node_size=None if options.intra_node_size == AUTO else options.intra_node_size,
        backward="burst" if options.backward == AUTO else options.backward, heads=heads)


def check_decided(topology: CPTopology, options: BurstOptions, *, cp: int,
                  heads: HeadShape) -> CPTopology:
    """A topology decided elsewhere (once per run), checked where it is used: made for this
    group and these heads (element size aside: it only weighs the time model's choice), and
    doing what ``options`` fix (every option given by value; 'auto' and options not given
    fix nothing)."""
    made_for = None if topology.heads is None else (
        topology.heads.hq, topology.heads.hkv, topology.heads.head_dim, topology.heads.v_head_dim)
    if topology.cp != cp or made_for not in (None, (heads.hq, heads.hkv, heads.head_dim,
                                                     heads.v_head_dim)):
        raise ValueError(f"topology was resolved for cp={topology.cp} and heads "
                         f"{topology.heads}, but here cp={cp} and heads are {heads}")
    asked = options.fixes()
    if asked:
        held = dict(ulysses=topology.ulysses, intra_node_size=topology.intra_node_size,
                    backward=topology.backward)
        try:
            same = CPTopology.build(cp, **{**held, **asked}, heads=topology.heads) == topology
        except ValueError:
            same = False
        if not same:
            raise ValueError(f"the topology given ({topology.describe()}) does not do what "
                             f"the options given with it fix: {asked}")
    return topology


@functools.lru_cache(maxsize=256)  # every layer of a model, and every call, asks alike
def _ranked(cp: int, heads: HeadShape, tokens: int, max_intra_node_size: int | None,
            causal: bool, backward: str, ulysses: int | str, intra_node_size: int | str | None,
            prof: Profile, pack: PackLoad | None) -> tuple:
    fixed = fixed_topology(BurstOptions(backward=backward, ulysses_size=ulysses,
                                        intra_node_size=intra_node_size), cp=cp, heads=heads)
    price = None if pack is None else (  # a pack: its own schedule, step by step
        lambda t: predict_pack(t, prof, pack, max_intra_node_size=max_intra_node_size))
    ranked = choose(cp, heads, tokens=tokens, causal=causal, prof=prof,
                    max_intra_node_size=max_intra_node_size, price=price,
                    ulysses=AUTO if ulysses == AUTO else fixed.ulysses,
                    intra_node_size=AUTO if intra_node_size == AUTO else fixed.intra_node_size,
                    backward=backward)
    logger.info("burst auto (%d tokens per rank, %s): profile %s (%s) decides: %s", tokens,
                pack.describe() if pack else "causal" if causal else "full", prof.name,
                measured_when(prof),
                ranked[0].describe())
    return tuple(ranked)
