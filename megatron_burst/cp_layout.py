"""The context-parallel layout: one frozen value that every other part of the package reads.

How a context-parallel (CP) group of ``cp`` ranks runs attention is decided once, here:

- ``ulysses``: ranks that trade heads for sequence by all-to-all before the ring (1 = none);
- the ring of ``cp / ulysses`` members that K/V travel round;
- ``ranks_per_node``: CP ranks of the group that share a node, in *ranks* (never in ring
  positions). With ``ranks_per_node`` L the ring is a double ring of L/U positions per
  node; ``None`` is a flat ring;
- the backward mode, resolved ('burst' or 'ring', never 'auto');
- how Megatron spells all that (``--cp-comm-type``, ``--hierarchical-context-parallel-sizes``);
- what one attention call sends, per rank (from ``cost``'s formulas).

Three sources build it and must agree: ``burst_attn``'s keyword arguments
(``CPLayout.build``), Megatron's command line or TransformerConfig (``from_megatron``,
``from_megatron_args``) and a YAML run config (``from_run_config``). The latter two only read
attributes, so this module imports neither megatron-core nor the launch layer.
"""
from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Sequence

from . import cost

BACKWARD_MODES = ("auto", "burst", "ring")
RING_COMM_TYPE = "burst"  # --cp-comm-type for the (double) ring
HYBRID_COMM_TYPE = "a2a+burst"  # --cp-comm-type for Ulysses x ring
# Megatron's argparse default for --cp-comm-type is "p2p"; with the burst layer in the spec
# the ring that runs *is* a point-to-point ring, so these are read as the two above. "a2a"
# and "allgather" name other algorithms and are refused, never replaced by a ring.
COMM_TYPE_ALIASES = {None: RING_COMM_TYPE, "p2p": RING_COMM_TYPE, RING_COMM_TYPE: RING_COMM_TYPE,
                     "a2a+p2p": HYBRID_COMM_TYPE, HYBRID_COMM_TYPE: HYBRID_COMM_TYPE}


@dataclasses.dataclass(frozen=True)
class HeadShape:
    """Attention heads of one rank (after tensor parallelism) and bytes per element."""

    hq: int
    hkv: int
    head_dim: int
    elem_bytes: int = 2


@dataclasses.dataclass(frozen=True)
class CPLayout:
    """How one CP group runs attention. Build it with ``CPLayout.build`` (validated)."""

    cp: int
    ulysses: int
    ranks_per_node: int | None  # CP ranks per node of the double ring; None = flat ring
    backward: str  # 'burst' or 'ring'
    heads: HeadShape | None = None

    # ------------------------------------------------------------------ construction

    @staticmethod
    def build(cp: int, *, ulysses: int = 1, ranks_per_node: int | None = None,
              backward: str = "auto", heads: HeadShape | None = None) -> "CPLayout":
        """Validate and normalise; resolve ``backward='auto'`` for ``heads``.

        Raises ValueError naming the argument. ``ranks_per_node`` that holds the whole group,
        or only one ring position, is the flat ring (None).
        """
        return _build(cp, ulysses, ranks_per_node, backward, heads)

    @staticmethod
    def from_megatron(cp: int, cp_comm_type: str | None,
                      hierarchical_sizes: Sequence[int] | None = None, *,
                      backward: str | None = None, intra_node_size: int | None = None,
                      ulysses_size: int | None = None,
                      heads: HeadShape | None = None) -> "CPLayout":
        """Megatron's CP settings plus the ``--burst-*`` options.

        Megatron's hierarchical sizes list consecutive-rank levels, innermost first. With
        ``a2a+burst`` the first level is the Ulysses group, and any further levels describe
        the ring: [U, M] a flat ring, [U, L/U, M] a double ring. With ``burst``: [L, M] a
        double ring of L ranks per node. Explicit ``--burst-*`` values must agree with them.
        """
        comm = COMM_TYPE_ALIASES.get(cp_comm_type, "refused")
        if comm == "refused":
            raise ValueError(
                f"cp_comm_type={cp_comm_type!r} is not a BurstAttention mode; use "
                f"'{RING_COMM_TYPE}' (ring, optionally double ring) or '{HYBRID_COMM_TYPE}' "
                f"(Ulysses x ring)")
        hier = [int(x) for x in hierarchical_sizes] if hierarchical_sizes else []
        if hier and math.prod(hier) != cp:
            raise ValueError(f"hierarchical_context_parallel_sizes={hier} multiply to "
                             f"{math.prod(hier)}, but the context-parallel size is {cp}")
        u_hier, per_node_hier = _read_hierarchy(comm, hier)
        if comm == HYBRID_COMM_TYPE and u_hier is None and ulysses_size is None:
            raise ValueError(f"cp_comm_type='{HYBRID_COMM_TYPE}' needs "
                             f"--burst-ulysses-size or --hierarchical-context-parallel-sizes "
                             f"(Ulysses size first)")
        ulysses = _agree("ulysses_size", ulysses_size, u_hier, 1)
        per_node = _agree("intra_node_size", intra_node_size, per_node_hier, None)
        return CPLayout.build(cp, ulysses=ulysses, ranks_per_node=per_node,
                              backward=backward or "auto", heads=heads)

    @staticmethod
    def from_megatron_args(args: Any) -> "CPLayout":
        """From a Megatron argparse namespace (with ``--burst-*`` added by
        ``megatron_burst.megatron.arguments``). Anything left 'auto' is decided by the time
        model for the run's shape (tokens per rank from --seq-length and the micro batch),
        the profile of ``--burst-profile`` and torchrun's LOCAL_WORLD_SIZE."""
        comm = args.cp_comm_type[0] if isinstance(args.cp_comm_type, list) else args.cp_comm_type
        tp = args.tensor_model_parallel_size
        heads = args.num_attention_heads
        kv = args.num_query_groups if getattr(args, "group_query_attention", False) else heads
        head_dim = getattr(args, "kv_channels", None) or args.hidden_size // heads
        elem = 4 if not (getattr(args, "bf16", False) or getattr(args, "fp16", False)) else 2
        for name, count in (("--num-attention-heads", heads), ("--num-query-groups", kv)):
            if count % tp:
                raise ValueError(f"{name} {count} is not divisible by the tensor parallel "
                                 f"size {tp}")
        shape = HeadShape(heads // tp, kv // tp, head_dim, elem)
        cp = args.context_parallel_size
        options = dict(backward=getattr(args, "burst_backward", None),
                       intra_node_size=getattr(args, "burst_intra_node_size", None),
                       ulysses_size=getattr(args, "burst_ulysses_size", None))
        if "auto" not in options.values():
            return CPLayout.from_megatron(cp, comm, args.hierarchical_context_parallel_sizes,
                                          heads=shape, **options)
        import os

        from .timing import auto_layout
        local = int(os.environ.get("LOCAL_WORLD_SIZE", "0")) // tp
        tokens = getattr(args, "micro_batch_size", 1) * args.seq_length // cp
        fixed = CPLayout.from_megatron(cp, comm, args.hierarchical_context_parallel_sizes,
                                       heads=shape, backward="burst", **{
                                           k: (None if v == "auto" else v)
                                           for k, v in options.items() if k != "backward"})
        return auto_layout(
            cp, shape, tokens, True, min(local, cp) if local > 0 else None,
            "auto" if options["ulysses_size"] == "auto" else fixed.ulysses,
            "auto" if options["intra_node_size"] == "auto" else fixed.ranks_per_node,
            options["backward"] or "auto", getattr(args, "burst_profile", None))

    @staticmethod
    def from_run_config(cfg: Any) -> "CPLayout":
        """From a ``megatron_burst.launch.config.Config`` (a YAML run config).

        ``burst.intra_node_size`` counts CP ranks per node; 1 is the flat ring.
        ``burst.backward`` or ``burst.ulysses_size`` 'auto' is decided by the time model
        with the cluster's profile, for the config's tokens per rank.
        """
        m, p, b = cfg.model, cfg.parallel, cfg.burst
        elem = 2 if cfg.training.precision == "bf16" else 4
        heads = HeadShape(m.num_attention_heads // p.tensor, m.num_query_groups // p.tensor,
                          m.hidden_size // m.num_attention_heads, elem)
        per_node = None if b.intra_node_size == 1 else b.intra_node_size
        if "auto" not in (b.backward, b.ulysses_size):
            return CPLayout.build(p.context, ulysses=b.ulysses_size, ranks_per_node=per_node,
                                  backward=b.backward, heads=heads)
        from .timing import auto_layout
        tokens = cfg.training.micro_batch_size * m.seq_length // p.context
        cp_per_node = max(1, min(p.context, cfg.cluster.gpus_per_node // p.tensor))
        return auto_layout(p.context, heads, tokens, True, cp_per_node, b.ulysses_size,
                           per_node, b.backward, cfg.cluster.profile_name)

    # ------------------------------------------------------------------ topology

    @property
    def ring_size(self) -> int:
        """Members of the ring (each a Ulysses group of ``ulysses`` ranks)."""
        return self.cp // self.ulysses

    @property
    def double(self) -> bool:
        return self.ranks_per_node is not None

    @property
    def inner_ring(self) -> int:
        """Ring positions per node (the whole ring when flat)."""
        return self.ranks_per_node // self.ulysses if self.double else self.ring_size

    @property
    def outer_ring(self) -> int:
        """Nodes the ring crosses (1 when flat)."""
        return self.ring_size // self.inner_ring

    @property
    def ring_heads(self) -> tuple[int, int]:
        """(q heads, k/v heads) each ring member holds: Ulysses splits heads U ways; with
        fewer k/v heads than U each is replicated to U/hkv slots."""
        h = self._need_heads()
        return h.hq // self.ulysses, max(h.hkv // self.ulysses, 1)

    @property
    def cp_comm_type(self) -> str:
        return HYBRID_COMM_TYPE if self.ulysses > 1 else RING_COMM_TYPE

    @property
    def hierarchical_sizes(self) -> list[int] | None:
        """Megatron's --hierarchical-context-parallel-sizes for this layout (None: flat)."""
        if self.ulysses > 1:
            ring = [self.inner_ring, self.outer_ring] if self.double else [self.ring_size]
            return [self.ulysses, *ring] if self.ring_size > 1 else None
        return [self.ranks_per_node, self.outer_ring] if self.double else None

    def describe(self) -> str:
        """One line for logs and plans."""
        if self.double:
            ring = f"double ring {self.inner_ring} x {self.outer_ring}"
        else:
            ring = f"flat ring {self.ring_size}"
        return f"cp={self.cp}: ulysses {self.ulysses} x {ring}, backward {self.backward}"

    # ------------------------------------------------------------------ bytes

    def call_bytes(self, tokens_local: int, *, lse_grad: bool = False) -> tuple[int, int]:
        """(forward, backward) bytes one rank sends in one attention call over
        ``tokens_local`` tokens (batch x local sequence): the ring and the all-to-alls, with
        every row travelling every hop: the plain sequence's bound (``rank_bytes`` is exact).
        """
        h = self._need_heads()
        hq, hkv = self.ring_heads
        tokens = tokens_local * self.ulysses  # a ring member holds its Ulysses group's tokens
        fwd = cost.forward_bytes(self.ring_size, tokens, hkv, h.head_dim, h.elem_bytes)
        bwd = cost.backward_bytes(self.backward, self.ring_size, tokens, hq, hkv, h.head_dim,
                                  h.elem_bytes)
        a2a_fwd, a2a_bwd = cost.ulysses_bytes(self.ulysses, tokens_local, h.hq, h.hkv,
                                              h.head_dim, h.elem_bytes, lse_grad=lse_grad)
        return fwd + a2a_fwd, bwd + a2a_bwd

    def rank_bytes(self, rank: int, *, batch: int, s_local: int, layout: str = "zigzag",
                   doc_lens: tuple[int, ...] | None = None, causal: bool = True,
                   window: tuple[int, int] = (-1, -1), lse_grad: bool = False
                   ) -> tuple[int, int]:
        """(forward, backward) bytes CP rank ``rank`` sends in one call, exactly as the ring
        sends them: only the rows each hop's receiver uses (``schedule.needed_rows``)."""
        from .comm.topology import RingTopology
        from .schedule import Mask, RingSchedule

        h = self._need_heads()
        hq, hkv = self.ring_heads
        d, e = h.head_dim, h.elem_bytes
        docs = doc_lens or (s_local * self.cp,)
        sched = RingSchedule.of(layout, self.cp, docs, Mask(causal, tuple(window)),
                                self.ulysses)
        fwd = bwd = 0
        if self.ring_size > 1:
            topo = RingTopology(list(range(self.ring_size)), rank // self.ulysses,
                                self.inner_ring)
            kv_row = batch * 2 * hkv * d * e
            k_rows = sched.needed_rows(topo.source, "k")
            fwd = cost.ring_pass_bytes(topo, k_rows, kv_row)
            if self.backward == "ring":
                bwd = cost.ring_pass_bytes(topo, k_rows, kv_row, batch * 2 * hkv * d * 4)
            else:
                rev = topo.reversed()
                bwd = cost.ring_pass_bytes(rev, sched.needed_rows(rev.source, "q"),
                                           batch * (2 * hq * d * e + 2 * hq * 4),
                                           batch * hq * d * 4)
        a2a_fwd, a2a_bwd = cost.ulysses_bytes(self.ulysses, batch * s_local, h.hq, h.hkv, d,
                                              e, lse_grad=lse_grad)
        return fwd + a2a_fwd, bwd + a2a_bwd

    def hop_bytes(self, tokens_local: int) -> int:
        """Bytes of one forward K/V hop."""
        h = self._need_heads()
        return cost.forward_bytes(2, tokens_local * self.ulysses, self.ring_heads[1],
                                  h.head_dim, h.elem_bytes)

    def _need_heads(self) -> HeadShape:
        if self.heads is None:
            raise ValueError("this CPLayout was built without heads; pass heads=HeadShape(...)")
        return self.heads


def _read_hierarchy(comm: str, hier: list[int]) -> tuple[int | None, int | None]:
    """(Ulysses size, ranks per node) as Megatron's hierarchical sizes describe them."""
    if not hier:
        return None, None
    if comm == HYBRID_COMM_TYPE:
        u, ring = hier[0], hier[1:]
        if len(ring) > 2:
            raise ValueError(f"hierarchical_context_parallel_sizes={hier}: with "
                             f"'{HYBRID_COMM_TYPE}' give [ulysses, ring] or "
                             f"[ulysses, ring positions per node, nodes]")
        return u, (u * ring[0] if len(ring) == 2 else None)
    if len(hier) != 2:
        raise ValueError(f"hierarchical_context_parallel_sizes={hier}: with "
                         f"'{RING_COMM_TYPE}' give [ranks per node, nodes]")
    return None, hier[0]


def _agree(name: str, explicit: int | None, implied: int | None, default: int | None
           ) -> int | None:
    """The explicit value, else the hierarchical sizes' value; both given must be equal."""
    if explicit is not None and implied is not None and int(explicit) != implied:
        raise ValueError(f"burst {name}={explicit} contradicts "
                         f"hierarchical_context_parallel_sizes (which give {implied})")
    value = explicit if explicit is not None else implied
    return default if value is None else value


@functools.lru_cache(maxsize=256)
def _build(cp: int, ulysses: int, ranks_per_node: int | None, backward: str,
           heads: HeadShape | None) -> CPLayout:
    if not _is_int(cp) or cp < 1:
        raise ValueError(f"the context-parallel size must be a positive int, got {cp!r}")
    if not _is_int(ulysses) or ulysses < 1 or cp % ulysses:
        raise ValueError(f"ulysses_size ({ulysses!r}) must be a positive int dividing the "
                         f"context-parallel size ({cp})")
    if ranks_per_node is not None:
        if (not _is_int(ranks_per_node) or ranks_per_node < 1 or cp % ranks_per_node
                or ranks_per_node % ulysses):
            raise ValueError(f"intra_node_size ({ranks_per_node!r}) must divide the "
                             f"context-parallel size ({cp}) and be a multiple of "
                             f"ulysses_size ({ulysses})")
        positions = ranks_per_node // ulysses
        if positions <= 1 or positions >= cp // ulysses:
            ranks_per_node = None  # one position per node, or the whole ring: a flat ring
    if backward not in BACKWARD_MODES:
        raise ValueError(f"backward must be one of {BACKWARD_MODES}, got {backward!r}")
    if heads is not None:
        _check_heads(heads, ulysses)
    if backward == "auto":
        if heads is None:
            raise ValueError("backward='auto' needs the head shape to choose a mode")
        ring = cp // ulysses
        hq, hkv = heads.hq // ulysses, max(heads.hkv // ulysses, 1)
        backward = cost.choose_backward(ring, hq, hkv, heads.head_dim, heads.elem_bytes)
    return CPLayout(cp, ulysses, ranks_per_node, backward, heads)


def _check_heads(heads: HeadShape, ulysses: int) -> None:
    if heads.hkv < 1 or heads.hq % heads.hkv:
        raise ValueError(f"the number of q heads ({heads.hq}) must be a multiple of the "
                         f"number of k/v heads ({heads.hkv})")
    if ulysses > 1:
        if heads.hq % ulysses:
            raise ValueError(f"ulysses_size ({ulysses}) must divide the number of q heads "
                             f"({heads.hq})")
        if heads.hkv % ulysses and ulysses % heads.hkv:
            raise ValueError(f"ulysses_size ({ulysses}) and the number of k/v heads "
                             f"({heads.hkv}) must divide one another")


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)
