"""A document pack's kernel calls made on the GPU from its boundaries (layout ``pack_zigzag``):
the host plans a length once, and a new pack costs it nothing.

Why: a pack placed by its documents (``whole_docs``, per-document ``zigzag``) has a new
placement, new hops and new kernel calls every micro-batch, all made on the host, and the
ranks must agree on it before a byte moves; at 8-16K tokens per GPU that host work, not the
GPU, bounds the call, and none of it can be captured in a CUDA graph. ``pack_zigzag``
places the pack as one plain sequence (zigzag chunks, whatever the documents), so the ring
schedule, the hops and the calls' row ranges are those of a plain sequence of that length,
planned once. The documents only change which pairs inside each block are visible (query
and key in one document; causal: key <= query), and a varlen flash call computes exactly
that when its sequences are the documents cut to the block. For a block of query rows at
global positions [gq, gq + nq) against key rows at [gk, gk + nk), sequence i holds
document i's query rows clamp(cu_i - gq, 0, nq) .. clamp(cu_i+1 - gq, 0, nq), and its key
rows likewise. It is exact because:

- the blocks are pairs of *runs* of a shard (rows and positions both consecutive), so a
  block's rows are one stretch of the sequence;
- a ``full`` block of a causal mask has every key before every query: within one document
  all its pairs are visible, and flash's non-causal call sees them all;
- a ``causal`` block's query and key runs end at the same position (they are one run), so
  a document's cut of both ends there too, and flash's bottom-right causal mask is
  key <= query;
- a sequence with queries but no keys gives zeros with lse +inf from flash (its marker
  for "nothing seen"), mended to -inf (``BoundLaunch.keyless``); one with keys but no
  queries gives zero gradients for its keys. Every query row and every key row is in
  exactly one sequence of each block, so a call writes every row it covers, as the plan's
  fresh/uses counts assume.

The kernel launches a row of thread blocks per sequence, empty or not, so a block cut into
every document of the pack is mostly empty sequences. A member's own block (its rows
against its own keys) is one call over all its rows (``own_launch``), its sequences the
documents as the shard's rows hold them. A *span* block (a causal mask's block whose keys
all precede its queries) needs three: only the document holding its first query
can hold keys of the block too (documents are contiguous), so it is the keys before that
document against no query, that document's queries against its keys, and the rest of the
queries against nothing (``BoundarySides._span_table``: one ``searchsorted``).

A call's boundary tables (``BoundarySides.table``) are one [R, N + 3] int32 tensor for the
blocks cut by documents (R block sides, each a row of packed boundaries) and one for the
span blocks, made by a few tensor ops; every launch's cu_seqlens_q and cu_seqlens_k are
row ranges of one of them (views). The boundaries are framed
(0, cu..., total) and made nondecreasing (cummax) first, so a malformed
cu_seqlens can give a wrong answer (reported, ``attention.agree.check_boundaries``) but
never sends a kernel outside its rows. Nothing is read on the host: the call can be
captured in a CUDA graph and replayed with the next pack's boundaries.
"""
from __future__ import annotations

import dataclasses
import functools

import numpy as np
import torch

from ..plan.blocks import Block
from ..plan.segments import Shard
from .varlen import KernelLaunch, Runs, mask_shape, plan_calls

Run = tuple[int, int, int]  # (first row, first position, length)


def runs_of(shard: Shard) -> tuple[Run, ...]:
    """The shard's segments joined where both rows and positions continue (a plain
    sequence: one document, no padding)."""
    out: list[list[int]] = []
    for seg in shard:
        if out and out[-1][0] + out[-1][2] == seg.row and out[-1][1] + out[-1][2] == seg.pos:
            out[-1][2] += seg.length
        else:
            out.append([seg.row, seg.pos, seg.length])
    return tuple(map(tuple, out))


def _kind(q: Run, k: Run, causal: bool) -> str | None:
    """The block of query run ``q`` against key run ``k`` under the plain mask (None: no
    pair visible)."""
    if not causal:
        return "full"
    (_, pq, nq), (_, pk, nk) = q, k
    if pk + nk <= pq:
        return "full"
    if pk >= pq + nq:
        return None
    if pk + nk == pq + nq and nk == nq:
        return "causal"
    raise ValueError(f"layout 'pack_zigzag': query positions {pq}..{pq + nq} and key positions "
                     f"{pk}..{pk + nk} overlap in part, which no placement of it makes")


Side = tuple[int, int, int]  # a block side: (packed offset, rows, first position)


@dataclasses.dataclass(eq=False)
class BoundarySides:
    """The block sides of one plan's device launches: a row of the documents' table each
    (``sides``), or, for a span block, a row of the span table (``spans``: its query side
    and its key side). Filled while the plan is built, then fixed."""

    total: int  # the sequence's tokens (the last boundary)
    sides: list[Side] = dataclasses.field(default_factory=list)
    spans: list[tuple[int, ...]] = dataclasses.field(default_factory=list)
    launches: list["DeviceLaunch"] = dataclasses.field(default_factory=list)  # by ``index``
    _device: dict = dataclasses.field(default_factory=dict, repr=False)

    def add(self, sides: list[Side]) -> tuple[int, int]:
        """Append ``sides``; their rows of the documents' table."""
        start = len(self.sides)
        self.sides.extend(sides)
        return start, len(self.sides)

    def add_spans(self, q_sides: list[Side], k_sides: list[Side]) -> tuple[int, int]:
        """Append span blocks (their query and key sides); their rows of the span table."""
        start = len(self.spans)
        self.spans.extend(q + k for q, k in zip(q_sides, k_sides))
        return start, len(self.spans)

    def new_launch(self, q_runs: Runs, k_runs: Runs, window: tuple[int, int], causal: bool,
                   **fields) -> "DeviceLaunch":
        """A device launch of this plan, in its place of ``launches`` (its ``index``)."""
        launch = DeviceLaunch((), True, q_runs, k_runs, (), (), window, causal,
                              index=len(self.launches), **fields)
        self.launches.append(launch)
        return launch

    def bind(self, cu: torch.Tensor) -> tuple["BoundLaunch", ...]:
        """Every launch of the plan bound to one call's boundaries ``cu``, once for all the
        call's passes (``launches[i]`` for the launch of ``index`` i)."""
        tables = self.table(cu)
        return tuple(launch.bound(tables) for launch in self.launches)

    def _on(self, device: torch.device, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
        key = (str(device), dtype)
        if key not in self._device:
            def columns(rows, width, shape):
                arr = np.asarray(rows, dtype=np.int64).reshape(-1, width)
                return [torch.from_numpy(arr[:, i].copy()).reshape(shape).to(device, dtype)
                        for i in range(width)]
            self._device[key] = (*columns(self.sides, 3, (-1, 1)),
                                 *columns(self.spans, 6, (-1,)),
                                 torch.zeros((), dtype=dtype, device=device),
                                 torch.tensor([0, self.total], dtype=dtype, device=device))
        return self._device[key]

    def table(self, cu: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The call's boundary tables for boundaries ``cu`` (on any device; see the module
        docstring), no host read: the documents' [R, len(cu) + 2] and the spans' [2, S, 4],
        int32. Framed by 0 and the total and made nondecreasing first, every row covers its
        block's rows, whatever ``cu`` holds."""
        offs, rows, starts, *span, zero, ends = self._on(cu.device, torch.int32)
        framed = torch.cat((ends[:1], cu.to(torch.int32), ends[1:])).cummax(0).values
        docs = torch.clamp(framed - starts, min=zero, max=rows).add_(offs)
        return docs, self._span_table(framed, zero, *span)

    @staticmethod
    def _span_table(framed, zero, off_q, n_q, g_q, off_k, n_k, g_k) -> torch.Tensor:
        """A span block (keys before queries, causal): only the document holding its first
        query can hold keys too, so it is three sequences: the keys before that document
        against no query (their gradients: zeros), its queries against its keys, the other
        queries against nothing. [2 (q, k), S, 4] boundaries."""
        idx = torch.searchsorted(framed, g_q, right=True)  # the first boundary past g_q
        start, end = framed[torch.stack((idx - 1, idx))]
        q_cut = torch.minimum(end - g_q, n_q)
        k_cut = torch.clamp(start - g_k, min=zero, max=n_k)  # n_k: it starts after the keys
        none = zero.expand_as(n_q)
        q_rows = torch.stack((none, none, q_cut, n_q), 1).add_(off_q[:, None])
        k_rows = torch.stack((none, k_cut, n_k, n_k), 1).add_(off_k[:, None])
        return torch.stack((q_rows, k_rows))


@dataclasses.dataclass(frozen=True, eq=False)
class DeviceLaunch(KernelLaunch):
    """A varlen call whose boundaries a call's table holds (rows ``q_table`` and
    ``k_table``): the plan's template, bound to a call's table by ``bound``."""

    q_table: tuple[int, int] = (0, 0)  # rows of the documents' table (a span: its table)
    k_table: tuple[int, int] = (0, 0)
    span: bool = False  # keys before queries under a causal mask: three sequences a block
    index: int = 0  # its place in the plan's ``BoundarySides.launches``
    longest: int = 0  # the most rows of any block side: the kernel's max_seqlen
    keyless: bool = False  # some query row may have no key of its document here
    summed: bool = False  # a member's own rows: its runs' table rows summed (``own_launch``)

    @functools.cached_property
    def max_q(self) -> int:
        return self.longest

    @functools.cached_property
    def max_k(self) -> int:
        return self.longest

    def bound(self, tables: tuple[torch.Tensor, torch.Tensor]) -> "BoundLaunch":
        if self.span:
            rows = tables[1][:, self.q_table[0]:self.q_table[1]]
            cu_q, cu_k = rows[0].reshape(-1), rows[1].reshape(-1)
        elif self.summed:
            cu_q = cu_k = tables[0][self.q_table[0]:self.q_table[1]].sum(0, dtype=torch.int32)
        else:
            cu_q = tables[0][self.q_table[0]:self.q_table[1]].reshape(-1)
            cu_k = tables[0][self.k_table[0]:self.k_table[1]].reshape(-1)
        return BoundLaunch(self.q_runs, self.k_runs, self.window, self.causal, self.longest,
                           self.keyless, cu_q, cu_k)


@dataclasses.dataclass(frozen=True, eq=False)
class BoundLaunch:
    """A ``DeviceLaunch`` with one call's boundaries: what the kernels read."""

    q_runs: Runs
    k_runs: Runs
    window: tuple[int, int]
    causal: bool
    longest: int
    keyless: bool
    cu_q_device: torch.Tensor
    cu_k_device: torch.Tensor
    varlen = True
    blocks = ()
    in_place = None  # its sequences are the table's: read packed

    @property
    def max_q(self) -> int:
        return self.longest

    @property
    def max_k(self) -> int:
        return self.longest

    def cu_tensors(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        return self.cu_q_device, self.cu_k_device

    # For the kernels that loop over sequences (CPU): the boundaries on the host.
    @functools.cached_property
    def cu_q(self) -> np.ndarray:
        return _host(self.cu_q_device)

    @functools.cached_property
    def cu_k(self) -> np.ndarray:
        return _host(self.cu_k_device)

    def sequence_blocks(self):
        """Each sequence's block (None where it has no query or no key)."""
        for n, m in zip(np.diff(self.cu_q).tolist(), np.diff(self.cu_k).tolist()):
            yield Block.of_window(n, m, self.window, self.causal) if n and m else None


def _host(t: torch.Tensor) -> np.ndarray:
    if t.is_cuda:
        raise ValueError("layout 'pack_zigzag' never reads boundaries on the host: on CUDA "
                         "it needs a kernel that runs a varlen call in one launch")
    return t.numpy()


def pair_launches(q_shard: Shard, k_shard: Shard, causal: bool,
                  sides: BoundarySides) -> tuple[DeviceLaunch, ...]:
    """The device launches of queries ``q_shard`` against keys ``k_shard`` (see the module
    docstring): the runs' blocks, grouped as any blocks are (``plan_calls``, not merged:
    the runs are as merged as positions allow)."""
    q_runs, k_runs = runs_of(q_shard), runs_of(k_shard)
    if q_runs == k_runs and _in_order(q_runs):
        return (own_launch(q_runs, causal, sides),)
    blocks, runs = [], {}
    for q in q_runs:
        for k in k_runs:
            kind = _kind(q, k, causal)
            if kind is not None:
                blk = Block(q[0], q[0] + q[2], k[0], k[0] + k[2], kind)
                blocks.append(blk)
                runs[(blk.q_start, blk.k_start)] = (q, k)
    calls = plan_calls(blocks, varlen=True, dense_min_area=0.0, shape_free=True,
                       coalesce=False)
    return tuple(_launch(call, runs, sides, causal) for call in calls)


def _launch(call: KernelLaunch, runs: dict, sides: BoundarySides, causal: bool
            ) -> DeviceLaunch:
    q_sides, k_sides, keyless = [], [], False
    for j, blk in enumerate(call.blocks):
        (_, pq, nq), (_, pk, nk) = runs[(blk.q_start, blk.k_start)]
        q_sides.append((call.cu_q[j], nq, pq))
        k_sides.append((call.cu_k[j], nk, pk))
        keyless |= not (pk <= pq and pq + nq <= pk + nk)  # else a row sees its own key
    longest = max(n for _, n, _ in q_sides + k_sides)
    # Every document a sequence would make a block mostly of empty sequences, each costing
    # the kernel a row of thread blocks: a span block is three sequences instead.
    span = causal and not call.causal
    rows = sides.add_spans(q_sides, k_sides) if span else None
    return sides.new_launch(call.q_runs, call.k_runs, call.window, call.causal,
                            q_table=rows or sides.add(q_sides),
                            k_table=rows or sides.add(k_sides), span=span, longest=longest,
                            keyless=keyless)


def _in_order(runs: tuple[Run, ...]) -> bool:
    """Rows back to back and positions rising: the rows are in the positions' order, so a
    document's rows in the shard are one stretch of them."""
    return all(a[0] + a[2] == b[0] and a[1] + a[2] <= b[1] for a, b in zip(runs, runs[1:]))


def own_launch(runs: tuple[Run, ...], causal: bool, sides: BoundarySides) -> DeviceLaunch:
    """A member's own rows against its own keys as one call, whatever its runs (a zigzag
    rank holds two): sequence i is document i's rows of the whole shard, the sum over the
    runs of each run's rows before the boundary. Exact because the rows are in position
    order (``_in_order``): a document's rows are one stretch, and causal by row is causal by
    position, so flash's causal mask (query and key sequences of one length) is key <= query.
    One call instead of a block per pair of runs (a zigzag rank's second chunk against its
    first was a span call of its own): one launch, and no merge, fewer passes over the rows
    and fewer partials per row (``pass_plan.uses_of``) in both directions."""
    first, rows = runs[0][0], sum(n for _, _, n in runs)
    table = sides.add([(0, n, pos) for _, pos, n in runs])
    window, flash_causal = mask_shape(Block(0, rows, 0, rows, "causal" if causal else "full"))
    whole = ((first, first + rows),)
    return sides.new_launch(whole, whole, window, flash_causal, q_table=table, k_table=table,
                            summed=True, longest=rows)
