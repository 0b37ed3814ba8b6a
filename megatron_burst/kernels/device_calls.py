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
  queries computes nothing. Every query row is in exactly one sequence of each block, so
  a call writes every row it covers, as the plan's fresh/uses counts assume.

A call's boundary table (``BoundarySides.table``) is one [R, N + 3] int32 tensor, made by
five tensor ops: R block sides, each a row of packed boundaries; every launch's
cu_seqlens_q and cu_seqlens_k are row ranges of it (views). The boundaries are framed
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
from .varlen import KernelLaunch, Runs, plan_calls

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


@dataclasses.dataclass(eq=False)
class BoundarySides:
    """The block sides of one plan's device launches, a row of the boundary table each:
    (packed offset, rows, first position). Filled while the plan is built, then fixed."""

    total: int  # the sequence's tokens (the last boundary)
    sides: list[tuple[int, int, int]] = dataclasses.field(default_factory=list)
    _device: dict = dataclasses.field(default_factory=dict, repr=False)

    def add(self, sides: list[tuple[int, int, int]]) -> tuple[int, int]:
        """Append ``sides``; their rows of the table."""
        start = len(self.sides)
        self.sides.extend(sides)
        return start, len(self.sides)

    def _on(self, device: torch.device, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
        key = (str(device), dtype)
        if key not in self._device:
            arr = np.asarray(self.sides, dtype=np.int64).reshape(-1, 3)
            offs, rows, starts = (torch.from_numpy(arr[:, i:i + 1].copy()).to(device, dtype)
                                  for i in range(3))
            self._device[key] = (offs, rows, starts, torch.zeros((), dtype=dtype, device=device),
                                 torch.tensor([0, self.total], dtype=dtype, device=device))
        return self._device[key]

    def table(self, cu: torch.Tensor) -> torch.Tensor:
        """The call's boundary table for boundaries ``cu`` (on any device; see the module
        docstring): int32 [R, len(cu) + 2], no host read. Framed by 0 and the total and
        made nondecreasing, every row covers its block's rows, whatever ``cu`` holds."""
        offs, rows, starts, zero, ends = self._on(cu.device, torch.int32)
        framed = torch.cat((ends[:1], cu.to(torch.int32), ends[1:])).cummax(0).values
        return torch.clamp(framed - starts, min=zero, max=rows).add_(offs)

    def framed(self, cu: torch.Tensor) -> torch.Tensor:
        """(cu_0, 0, cu..., total, cu_N): nondecreasing exactly when ``cu`` starts at 0,
        never decreases and ends at the total (what ``check_boundaries`` reads)."""
        ends = self._on(cu.device, cu.dtype)[4]
        return torch.cat((cu[:1], ends[:1], cu, ends[1:], cu[-1:]))


@dataclasses.dataclass(frozen=True, eq=False)
class DeviceLaunch(KernelLaunch):
    """A varlen call whose boundaries a call's table holds (rows ``q_table`` and
    ``k_table``): the plan's template, bound to a call's table by ``bound``."""

    q_table: tuple[int, int] = (0, 0)
    k_table: tuple[int, int] = (0, 0)
    longest: int = 0  # the most rows of any block side: the kernel's max_seqlen
    keyless: bool = False  # some query row may have no key of its document here

    @functools.cached_property
    def max_q(self) -> int:
        return self.longest

    @functools.cached_property
    def max_k(self) -> int:
        return self.longest

    def bound(self, table: torch.Tensor) -> "BoundLaunch":
        cu_q = table[self.q_table[0]:self.q_table[1]].reshape(-1)
        cu_k = table[self.k_table[0]:self.k_table[1]].reshape(-1)
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
    return tuple(_launch(call, runs, sides) for call in calls)


def _launch(call: KernelLaunch, runs: dict, sides: BoundarySides) -> DeviceLaunch:
    q_sides, k_sides, keyless = [], [], False
    for j, blk in enumerate(call.blocks):
        (_, pq, nq), (_, pk, nk) = runs[(blk.q_start, blk.k_start)]
        q_sides.append((call.cu_q[j], nq, pq))
        k_sides.append((call.cu_k[j], nk, pk))
        keyless |= not (pk <= pq and pq + nq <= pk + nk)  # else a row sees its own key
    longest = max(n for _, n, _ in q_sides + k_sides)
    return DeviceLaunch((), True, call.q_runs, call.k_runs, (), (), call.window, call.causal,
                        q_table=sides.add(q_sides), k_table=sides.add(k_sides),
                        longest=longest, keyless=keyless)
