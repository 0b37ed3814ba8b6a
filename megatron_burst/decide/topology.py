"""The context-parallel topology: one frozen value that every other part of the package reads.

How a context-parallel (CP) group of ``cp`` ranks runs attention, once decided:

- ``ulysses``: ranks that trade heads for sequence by all-to-all before the ring (1 = none);
- the ring of ``cp / ulysses`` members that K/V travel round;
- ``intra_node_size``: CP ranks of the group that share a node, in *ranks* (never in ring
  positions). With ``intra_node_size`` L the ring is a double ring of L/U positions per
  node; ``None`` is a flat ring;
- the backward mode, resolved ('burst' or 'ring', never 'auto');
- how Megatron spells all that (``--cp-comm-type``, ``--hierarchical-context-parallel-sizes``);
- what one attention call sends, per rank (from ``cost``'s formulas).

``CPTopology.build`` validates a fully decided value. Deciding is not done here: every
'auto' (with the CP ranks a node holds) is settled by ``options.resolve``, the one resolver, from a
``BurstOptions``. (Where tokens sit on the ranks, the *placement*, is ``placement``'s.)
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any

from . import cost
from ..plan.layouts import ZIGZAG

BACKWARD_MODES = ("auto", "burst", "ring")
RESOLVED_BACKWARD = ("burst", "ring")
RING_COMM_TYPE = "burst"  # --cp-comm-type for the (double) ring
HYBRID_COMM_TYPE = "a2a+burst"  # --cp-comm-type for Ulysses x ring
# Megatron's argparse default for --cp-comm-type is "p2p"; with the burst layer in the spec
# the ring that runs *is* a point-to-point ring, so these are read as the two above. "a2a"
# and "allgather" name other algorithms and are refused, never replaced by a ring.
COMM_TYPE_ALIASES = {None: RING_COMM_TYPE, "p2p": RING_COMM_TYPE, RING_COMM_TYPE: RING_COMM_TYPE,
                     "a2a+p2p": HYBRID_COMM_TYPE, HYBRID_COMM_TYPE: HYBRID_COMM_TYPE}


class TopologyError(ValueError):
    """A topology that cannot be built, naming the setting at fault: ``setting`` is a
    ``BurstOptions`` field (``ulysses_size``, ``intra_node_size``, ``backward``) or a size of
    the model (``cp``, ``num_attention_heads``, ``num_query_groups``), so that a caller can
    blame its own spelling of it (``plan`` names the config key) without reading the text."""

    def __init__(self, setting: str, message: str):
        super().__init__(message)
        self.setting = setting


@dataclasses.dataclass(frozen=True)
class HeadShape:
    """Attention heads of one rank (after tensor parallelism) and bytes per element.

    ``head_dim`` is Q's and K's; ``v_head_dim`` V's (and the output's), which MLA makes
    smaller (DeepSeek-V3: 192 and 128). Left out it is ``head_dim``, so that a shape is
    equal to itself however it was spelt.
    """

    hq: int
    hkv: int
    head_dim: int
    elem_bytes: int = 2
    v_head_dim: int | None = None

    def __post_init__(self) -> None:
        if self.v_head_dim is None:
            object.__setattr__(self, "v_head_dim", self.head_dim)

    @staticmethod
    def of_tensors(q, k, v) -> "HeadShape":
        """The heads of a call's local q, k, v ([.., h, d]: bshd and sbhd alike)."""
        return HeadShape(q.shape[2], k.shape[2], q.shape[3], q.element_size(), v.shape[3])

    @staticmethod
    def of_tp_rank(heads: int, groups: int, head_dim: int, *, tp: int,
                   half: bool, v_head_dim: int | None = None) -> "HeadShape":
        """The heads one of ``tp`` tensor-parallel ranks holds (``half``: 16-bit)."""
        for count, what in ((heads, "num_attention_heads"), (groups, "num_query_groups")):
            if count % tp:
                raise TopologyError(what, f"{what} over tensor parallel size: {count} is "
                                          f"not divisible by {tp}")
        return HeadShape(heads // tp, groups // tp, head_dim, 2 if half else 4, v_head_dim)


@dataclasses.dataclass(frozen=True)
class CPTopology:
    """How one CP group runs attention. Build it with ``CPTopology.build`` (validated)."""

    cp: int
    ulysses: int
    intra_node_size: int | None  # CP ranks per node of the double ring; None = flat ring
    backward: str  # 'burst' or 'ring'
    heads: HeadShape | None = None

    # ------------------------------------------------------------------ construction

    @staticmethod
    def build(cp: int, *, ulysses: int = 1, intra_node_size: int | None = None,
              backward: str = "burst", heads: HeadShape | None = None) -> "CPTopology":
        """Validate and normalise a decided topology (``options.resolve`` decides 'auto').

        Raises TopologyError (a ValueError) naming the argument. ``intra_node_size`` that
        holds the whole group, or only one ring position, is the flat ring (None).
        """
        return _build(cp, ulysses, intra_node_size, backward, heads)

    @staticmethod
    def seq_len_divisor(cp: int) -> int:
        """What a sequence's length over ``cp`` CP ranks must be a multiple of: Megatron's
        split is the zigzag layout's (``plan.layouts``, which owns the rule)."""
        return ZIGZAG.divisor(cp)

    # ------------------------------------------------------------------ topology

    @property
    def ring_size(self) -> int:
        """Members of the ring (each a Ulysses group of ``ulysses`` ranks)."""
        return self.cp // self.ulysses

    @property
    def double(self) -> bool:
        return self.intra_node_size is not None

    @property
    def positions_per_node(self) -> int:
        """Ring positions per node, ``intra_node_size / ulysses`` (the whole ring when flat)."""
        return self.intra_node_size // self.ulysses if self.double else self.ring_size

    @property
    def outer_ring(self) -> int:
        """Nodes the ring crosses (1 when flat)."""
        return self.ring_size // self.positions_per_node

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
        """Megatron's --hierarchical-context-parallel-sizes for this topology (None: flat)."""
        if self.ulysses > 1:
            ring = [self.positions_per_node, self.outer_ring] if self.double else [self.ring_size]
            return [self.ulysses, *ring] if self.ring_size > 1 else None
        return [self.intra_node_size, self.outer_ring] if self.double else None

    def describe(self) -> str:
        """One line for logs and plans."""
        if self.double:
            ring = f"double ring {self.positions_per_node} x {self.outer_ring}"
        else:
            ring = f"flat ring {self.ring_size}"
        return f"cp={self.cp}: ulysses {self.ulysses} x {ring}, backward {self.backward}"

    # ------------------------------------------------------------------ bytes

    def call_bytes(self, tokens_local: int, *,
                   lse_returned: bool = False) -> tuple[int, int]:
        """(forward, backward) bytes one rank sends in one attention call over
        ``tokens_local`` tokens (batch x local sequence): the ring and the all-to-alls, with
        every row travelling every hop and the gradient accumulators in fp32: the plain
        sequence's bound (``rank_bytes`` is exact).
        """
        h = self._need_heads()
        hq, hkv = self.ring_heads
        tokens = tokens_local * self.ulysses  # a ring member holds its Ulysses group's tokens
        fwd = cost.forward_bytes(self.ring_size, tokens, hkv, h.head_dim, h.elem_bytes,
                                 v_head_dim=h.v_head_dim)
        bwd = cost.backward_bytes(self.backward, self.ring_size, tokens, hq, hkv, h.head_dim,
                                  h.elem_bytes, v_head_dim=h.v_head_dim, acc_bytes=4)
        a2a_fwd, a2a_bwd = cost.ulysses_bytes(self.ulysses, tokens_local, h.hq, h.hkv,
                                              h.head_dim, h.elem_bytes,
                                              lse_returned=lse_returned,
                                              v_head_dim=h.v_head_dim)
        return fwd + a2a_fwd, bwd + a2a_bwd

    def rank_bytes(self, rank: int, *, batch: int, s_local: int, layout: str = "zigzag",
                   doc_lens: tuple[int, ...] | None = None, causal: bool = True,
                   window: tuple[int, int] = (-1, -1), lse_returned: bool = False
                   ) -> tuple[int, int]:
        """(forward, backward) bytes CP rank ``rank`` sends in one call, exactly as the ring
        sends them: only the rows each hop's receiver uses (``RingSchedule.needed_rows``)."""
        from ..comm.ring_positions import RingPositions
        from ..plan.runs import pass_rounds
        from ..plan.schedule import Mask, RingSchedule

        h = self._need_heads()
        hq, hkv = self.ring_heads
        d, dv, e = h.head_dim, h.v_head_dim, h.elem_bytes
        docs = doc_lens or (s_local * self.cp,)
        sched = RingSchedule.of(layout, self.cp, docs, Mask(causal, tuple(window)),
                                self.ulysses)
        fwd = bwd = 0
        if self.ring_size > 1:
            topo = RingPositions(list(range(self.ring_size)), rank // self.ulysses,
                                self.positions_per_node)
            # One round the ring, or one each way (``attention.ring_rounds``): each round's
            # rows cut at its last step, its accumulators in fp32.
            rounds = pass_rounds(sched, topo, self.ulysses)
            kv_row = batch * cost.kv_row_bytes(hkv, d, e, dv)
            tables = [sched.needed_rows(t.source, "k", last) for t, last in rounds]
            fwd = sum(cost.ring_pass_bytes(t, rows, kv_row)
                      for (t, _), rows in zip(rounds, tables))
            side = "k" if self.backward == "ring" else "q"
            if side == "q":  # the burst backward's queries go the other way, round for round
                rounds = pass_rounds(sched, topo, self.ulysses, reverse=True)
                tables = [sched.needed_rows(t.source, side, last) for t, last in rounds]
            width = 4 if len(rounds) > 1 else accumulator_wire_bytes(sched, rounds[0][0], tables[0],
                                                           side, e)
            payload, acc = cost.backward_row_bytes(self.backward, hq, hkv, d, e, dv, width)
            bwd = sum(cost.ring_pass_bytes(t, rows, batch * payload, batch * acc)
                      for (t, _), rows in zip(rounds, tables))
        a2a_fwd, a2a_bwd = cost.ulysses_bytes(self.ulysses, batch * s_local, h.hq, h.hkv, d,
                                              e, lse_returned=lse_returned, v_head_dim=dv)
        return fwd + a2a_fwd, bwd + a2a_bwd

    def hop_bytes(self, tokens_local: int) -> int:
        """Bytes of one forward K/V hop."""
        h = self._need_heads()
        return cost.forward_bytes(2, tokens_local * self.ulysses, self.ring_heads[1],
                                  h.head_dim, h.elem_bytes, v_head_dim=h.v_head_dim)

    def backward_hop_bytes(self, tokens_local: int) -> int:
        """Bytes of one backward hop (payload and accumulator), the accumulator as wide as
        a ring of this size sends it (the inputs' dtype with one holder, else fp32)."""
        return sum(self.backward_hop_parts(tokens_local))

    def backward_hop_parts(self, tokens_local: int) -> tuple[int, int]:
        """(payload, gradient accumulator) bytes of one backward hop, as
        ``backward_hop_bytes`` counts them: the time model hides the first behind the
        step's compute, but the accumulator leaves only after the compute that fills it."""
        h = self._need_heads()
        hq, hkv = self.ring_heads
        payload, acc = cost.backward_row_bytes(
            self.backward, hq, hkv, h.head_dim, h.elem_bytes, h.v_head_dim,
            cost.acc_elem_bytes(h.elem_bytes, self.ring_size == 2))
        rows = tokens_local * self.ulysses
        return rows * payload, rows * acc

    def _need_heads(self) -> HeadShape:
        if self.heads is None:
            raise ValueError("this CPTopology was built without heads; pass heads=HeadShape(...)")
        return self.heads


@functools.lru_cache(maxsize=256)
def _build(cp: int, ulysses: int, intra_node_size: int | None, backward: str,
           heads: HeadShape | None) -> CPTopology:
    if not _is_int(cp) or cp < 1:
        raise TopologyError("cp", f"the context-parallel size must be a positive int, got "
                                  f"{cp!r}")
    if not _is_int(ulysses) or ulysses < 1 or cp % ulysses:
        raise TopologyError("ulysses_size", f"ulysses_size ({ulysses!r}) must be a positive "
                            f"int dividing the context-parallel size ({cp})")
    if intra_node_size is not None:
        if (not _is_int(intra_node_size) or intra_node_size < 1 or cp % intra_node_size
                or intra_node_size % ulysses):
            raise TopologyError("intra_node_size", f"intra_node_size ({intra_node_size!r}) "
                                f"must divide the context-parallel size ({cp}) and be a "
                                f"multiple of ulysses_size ({ulysses})")
        positions = intra_node_size // ulysses
        if positions <= 1 or positions >= cp // ulysses:
            intra_node_size = None  # one position per node, or the whole ring: a flat ring
    if backward not in RESOLVED_BACKWARD:
        raise TopologyError("backward", f"backward must be one of {RESOLVED_BACKWARD} here, "
                            f"got {backward!r} ('auto' is decided by "
                            f"megatron_burst.decide.options.resolve)")
    if heads is not None:
        check_heads(heads, ulysses)
    return CPTopology(cp, ulysses, intra_node_size, backward, heads)


def heads_split(heads: HeadShape, ulysses: int) -> bool:
    """Whether ``heads`` split over ``ulysses`` ranks (``check_heads`` says why not)."""
    try:
        check_heads(heads, ulysses)
    except ValueError:
        return False
    return True


def check_heads(heads: HeadShape, ulysses: int) -> None:
    """Raise TopologyError unless ``heads`` split over ``ulysses`` ranks (the one rule)."""
    if heads.hkv < 1 or heads.hq % heads.hkv:
        raise TopologyError("num_query_groups", f"the number of q heads ({heads.hq}) must be "
                            f"a multiple of the number of k/v heads ({heads.hkv})")
    if ulysses > 1:
        if heads.hq % ulysses:
            raise TopologyError("ulysses_size", f"ulysses_size ({ulysses}) must divide the "
                                f"number of q heads ({heads.hq})")
        if heads.hkv % ulysses and ulysses % heads.hkv:
            raise TopologyError("ulysses_size", f"ulysses_size ({ulysses}) and the number of "
                                f"k/v heads ({heads.hkv}) must divide one another")


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def accumulator_wire_bytes(sched, topo, rows, side: str, elem_bytes: int) -> int:
    """Bytes per element of the gradient accumulator position ``topo.index`` fills and
    sends, as its call's plan decides (``call_plan.PassPlan.wire``): the inputs' own where it
    is the only holder (the payload's last step is 1) and its blocks, as the kernels run them
    (``coalesced``), touch each row once (``plan.blocks.one_partial``); else fp32."""
    from ..plan.blocks import block_spans, coalesced, one_partial
    from ..plan.schedule import last_used_step

    last = last_used_step(rows)
    if last != 1:
        return 4
    me = topo.index
    src = topo.source(me, 1)
    blocks = coalesced(sched.blocks(me, src) if side == "k" else sched.blocks(src, me))
    return cost.acc_elem_bytes(elem_bytes, one_partial(last, block_spans(blocks, side)))
