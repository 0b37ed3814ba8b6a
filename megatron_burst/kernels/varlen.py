"""A ring step's blocks as few kernel calls: one varlen call per mask shape, not one per block.

With packed documents a ring step holds many small blocks (a block per document, per
segment, per band), and a kernel launch each costs more than the work. A varlen kernel
takes them all in one launch: the blocks' query rows are packed back to back, their key
rows likewise, and ``cu_seqlens_q/k`` say where each block starts. One call covers blocks
that share a mask shape (full, causal, or one band) and whose query rows are disjoint.

Large blocks of a plain sequence still go to the dense kernel one by one (cuDNN is faster
than the varlen flash kernel where launches do not matter, and a sequence's block shapes
repeat every step). A document pack's blocks change size with every batch, and cuDNN builds
an execution graph for every new shape (on one H200, a new pack through cuDNN took seconds
per call, the varlen flash kernel milliseconds: the "1 GPU cuDNN per document" and "1 GPU
varlen flash" rows of benchmarks/results/h200x2_documents_fresh.md), so there every block
goes varlen (``shape_free``): the flash kernel builds nothing per shape. So do the blocks of
a slice mask that changes from call to call (``attention.varying_masks``). Packing copies only
what is not already one contiguous run of rows; outputs are folded back run by run, as views
(``run_calls``).
"""
from __future__ import annotations

import dataclasses
import functools
import itertools
from typing import Sequence

import torch

import numpy as np

from ..plan.blocks import carved, coalesced
from ..plan.schedule import Block, Mask

Runs = tuple[tuple[int, int], ...]  # contiguous local row ranges, in packed order


@dataclasses.dataclass(frozen=True, eq=False)
class KernelLaunch:
    """One local kernel invocation of a ring step.

    Dense (one block): ``blocks[0]`` on row slices. Varlen: the blocks' query rows packed
    in ``q_runs`` order, key rows in ``k_runs`` order, sequence i being block i, its
    boundaries ``cu_q``/``cu_k`` (tuples for a few blocks, read-only int64 arrays for
    calls made from arrays, ``boundaries``).
    ``window`` is flash-attn's bottom-right aligned (left, right) for every sequence.
    A varlen call made from boundaries alone (``plan_alone``, documents held whole) has no
    ``blocks``: each sequence's block follows from its lengths and the window
    (``sequence_blocks``).
    """

    blocks: tuple[Block, ...]
    varlen: bool
    q_runs: Runs = ()
    k_runs: Runs = ()
    cu_q: np.ndarray | tuple[int, ...] = ()  # () for a dense call
    cu_k: np.ndarray | tuple[int, ...] = ()
    window: tuple[int, int] = (-1, -1)
    causal: bool = False
    _device_cu: dict = dataclasses.field(default_factory=dict, repr=False)
    keyless = False  # no query row lacks a key (``device_calls``: lse +inf is mended)

    @functools.cached_property  # read at every launch, by every layer
    def max_q(self) -> int:
        if self.varlen:
            return int(np.diff(self.cu_q).max())
        return self.blocks[0].q_stop - self.blocks[0].q_start

    @functools.cached_property
    def max_k(self) -> int:
        if self.varlen:
            return int(np.diff(self.cu_k).max())
        return self.blocks[0].k_stop - self.blocks[0].k_start

    def sequence_blocks(self):
        """Each packed sequence's block in its own coordinates (for kernels that run a
        varlen call one sequence at a time)."""
        if self.blocks:
            for blk in self.blocks:
                n, m = blk.q_stop - blk.q_start, blk.k_stop - blk.k_start
                yield Block(0, n, 0, m, blk.kind, blk.lo, blk.hi)
            return
        for n, m in zip(np.diff(self.cu_q).tolist(), np.diff(self.cu_k).tolist()):
            yield Block.of_window(n, m, self.window, self.causal)

    def cu_tensors(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """cu_seqlens_q/k as int32 tensors on ``device`` (``upload_boundaries`` put them
        there with the other calls' when the calls were planned)."""
        key = str(device)
        if key not in self._device_cu:
            upload_boundaries((self,), device)
        return self._device_cu[key]

    @functools.cached_property
    def in_place(self) -> "InPlaceBounds | None":
        """The call's boundaries where its rows are read where they lie (``in_place_bounds``)."""
        return in_place_bounds(self)

    def in_place_tensors(self, device: torch.device) -> tuple[torch.Tensor, ...]:
        """``in_place``'s cu_seqlens_q, key starts and seqused_k as int32 on ``device``."""
        key = f"{device} in place"
        if key not in self._device_cu:
            upload_boundaries((self,), device)
        return self._device_cu[key]


@dataclasses.dataclass(frozen=True)
class InPlaceBounds:
    """A varlen call's sequences read where they lie in the whole Q, K and V: no gather.

    Why: the packed form copies the blocks' query and key runs back to back before the
    kernel (a cat of narrows per tensor: block-causal documents' step 0 is 16 host ops and a
    copy of most of Q on the GPU). Flash's ``seqused_k`` lets sequence i read ``seqused_k[i]``
    key rows from row ``cu_k[i]``, wherever that is, so key ranges may overlap or skip rows;
    its queries are rows ``cu_q[i]:cu_q[i+1]`` of the whole Q, so query rows between blocks
    run as sequences of no keys (``block_of`` -1), which the kernel leaves zeros with lse
    +inf and no run reads. Its output holds every local query row at its own row.
    """

    cu_q: tuple[int, ...]
    cu_k: tuple[int, ...]  # each sequence's first key row, and one more (flash's batch + 1)
    seqused_k: tuple[int, ...]
    block_of: tuple[int, ...]  # per sequence: its block in ``KernelLaunch.blocks``, or -1
    max_q: int
    max_k: int


def in_place_bounds(call: KernelLaunch) -> InPlaceBounds | None:
    """``call``'s ``InPlaceBounds``; None where the packed form copies nothing (one run a
    side: views) or where there are no blocks to read them from (calls made from arrays)."""
    blocks = call.blocks
    if not (call.varlen and blocks) or (len(call.q_runs) == 1 and len(call.k_runs) == 1):
        return None
    longest = max(b.q_stop - b.q_start for b in blocks)
    cu_q, starts, used, block_of = [0], [], [], []
    for i, blk in enumerate(blocks):
        if blk.q_start < cu_q[-1]:
            return None  # query rows out of order: packed only (plan_calls never makes it)
        while cu_q[-1] < blk.q_start:  # rows between blocks, in pieces no longer than a
            cu_q.append(min(blk.q_start, cu_q[-1] + longest))  # block (the kernel's grid)
            starts.append(0), used.append(0), block_of.append(-1)
        cu_q.append(blk.q_stop)
        starts.append(blk.k_start), used.append(blk.k_stop - blk.k_start), block_of.append(i)
    return InPlaceBounds(tuple(cu_q), (*starts, starts[-1] + used[-1]), tuple(used),
                         tuple(block_of), longest, max(used))


def upload_boundaries(calls: Sequence[KernelLaunch], device: torch.device) -> None:
    """Put the cu_seqlens of every varlen call on ``device``: one host buffer, one copy.

    The buffer is pinned, so the copy is asynchronous: a copy from pageable memory makes
    the host wait for the stream, which once per call stalled every new pack's first layer.
    """
    plain, placed = str(device), f"{device} in place"
    packed = [c for c in calls if c.varlen and len(c.cu_q) and plain not in c._device_cu]
    # The in-place form only where a call has blocks (a call made from arrays has none).
    in_place = [c for c in calls if c.varlen and c.blocks and placed not in c._device_cu
                and c.in_place is not None]
    if not packed and not in_place:
        return
    host = torch.from_numpy(np.concatenate(
        [x for c in packed for x in (c.cu_q, c.cu_k)]
        + [x for c in in_place for x in (c.in_place.cu_q, c.in_place.cu_k,
                                         c.in_place.seqused_k)]).astype(np.int32))
    if device.type == "cuda":
        host = host.pin_memory()
    flat = host.to(device, non_blocking=True)
    offset = 0
    for c in packed:
        n = len(c.cu_q)
        c._device_cu[plain] = (flat[offset:offset + n], flat[offset + n:offset + 2 * n])
        offset += 2 * n
    for c in in_place:  # cu_q and cu_k: one more entry than seqused_k
        n = len(c.in_place.seqused_k)
        a, b = offset + n + 1, offset + 2 * n + 2
        c._device_cu[placed] = (flat[offset:a], flat[a:b], flat[b:b + n])
        offset += 3 * n + 2


def mask_shape(block: Block) -> tuple[tuple[int, int], bool]:
    """(flash window, causal) under which a varlen kernel computes exactly ``block``."""
    return block.flash_window, block.kind == "causal"


def plan_alone(lens: Sequence[int], mask: Mask) -> tuple[KernelLaunch, ...]:
    """A single member's pack (CP=1, documents kept in order and unpadded): every document
    against itself under ``mask`` as ONE varlen call over all the rows, made from the
    boundaries in a few array operations, whatever the number of documents. A window is
    flash's bottom-right window, the same for every document (on a document's square block
    it is the band; a document shorter than the window sees all it may)."""
    n = np.asarray(lens, dtype=np.int64)
    n = n[n > 0]
    if not n.size:
        return ()
    cu = boundaries(n)
    runs = ((0, int(cu[-1])),)
    return (KernelLaunch((), True, runs, runs, cu, cu, *document_shape(mask)),)


def document_shape(mask: Mask) -> tuple[tuple[int, int], bool]:
    """(flash window, causal) under which a varlen kernel computes ``mask`` on sequences that
    are whole documents: a square block with flash's bottom-right window is the band."""
    left, right = mask.window
    if mask.plain:
        return ((-1, 0), True) if mask.causal else ((-1, -1), False)
    return (left, 0 if mask.causal else right), False


def boundaries(lens: np.ndarray) -> np.ndarray:
    """cu_seqlens of sequences of ``lens`` rows: [0, n0, n0+n1, ...], read-only int64."""
    cu = np.concatenate(([0], lens.cumsum()))
    cu.flags.writeable = False
    return cu


def _shorter(b: Block) -> int:
    return min(b.q_stop - b.q_start, b.k_stop - b.k_start)


def plan_calls(blocks: Sequence[Block], *, varlen: bool, dense_min_area: float,
               shape_free: bool = False, coalesce: bool = True,
               grain: int | None = None, least: int = 0) -> tuple[KernelLaunch, ...]:
    """Group ``blocks`` into kernel calls.

    ``varlen`` False (no varlen kernel for this batch shape): one dense call per block.
    Otherwise blocks of at least ``dense_min_area`` visible pairs run dense, and the rest
    are grouped by mask shape into varlen calls with disjoint query rows; a group of one
    block runs dense too. ``shape_free`` (document packs, see the module docstring): every
    block goes into a varlen call, a lone one too. Blocks that together are one causal or
    full block run as that one (``plan.blocks.coalesced``), unless ``coalesce`` is False
    (``device_calls``: blocks whose rows must stay stretches of the sequence). ``grain``
    (shape-free only): full and causal blocks are carved first (``blocks.carved``), their
    cores each a dense call after the varlen calls of the rest; a block whose shorter side
    is under ``least`` rows stays whole (its cores would save the GPU less than their calls
    cost the host: ``thresholds.PACK_CARVE_MIN``).
    """
    blocks = coalesced(blocks) if coalesce else list(blocks)
    cores: list[KernelLaunch] = []
    if varlen and shape_free and grain:
        pieces = [carved(b, grain) if _shorter(b) >= least else ((), (b,)) for b in blocks]
        blocks = [b for _, rest in pieces for b in rest]
        cores = [KernelLaunch((b,), False) for core, _ in pieces for b in core]
    if not varlen or (len(blocks) < 2 and not shape_free):  # (nothing carved: no cores)
        return tuple(KernelLaunch((b,), False) for b in blocks)
    if shape_free:
        dense_min_area = float("inf")
    small = blocks if dense_min_area == float("inf") else [
        b for b in blocks if b.area < dense_min_area]
    calls = [] if small is blocks else [KernelLaunch((b,), False) for b in blocks
                                        if b.area >= dense_min_area]
    shapes: dict[tuple, list[list[Block]]] = {}
    for b in sorted(small, key=_by_rows):
        shape = _CAUSAL if b.kind == "causal" else mask_shape(b)
        waves = shapes.get(shape)
        if waves is None:
            shapes[shape] = [[b]]
        elif waves[0][-1].q_stop <= b.q_start:  # the usual case: the first wave has room
            waves[0].append(b)
        else:
            wave = next((w for w in waves[1:] if w[-1].q_stop <= b.q_start), None)
            if wave is None:
                waves.append([b])
            else:
                wave.append(b)
    for (window, causal), waves in shapes.items():
        for wave in waves:
            calls.append(_varlen_call(wave, window, causal) if len(wave) > 1 or shape_free
                         else KernelLaunch((wave[0],), False))
    return tuple(calls + cores)


_CAUSAL = ((-1, 0), True)  # mask_shape of every 'causal' block


def _by_rows(b: Block) -> tuple[int, int]:
    return b.q_start, b.k_start


def _varlen_call(wave: list[Block], window: tuple[int, int], causal: bool) -> KernelLaunch:
    q_ranges = [(b.q_start, b.q_stop) for b in wave]
    k_ranges = [(b.k_start, b.k_stop) for b in wave]
    # A few blocks: tuples, made without array operations (each costs more than the sums).
    cu_q = (0, *itertools.accumulate(b - a for a, b in q_ranges))
    cu_k = (0, *itertools.accumulate(b - a for a, b in k_ranges))
    return KernelLaunch(tuple(wave), True, join_runs(q_ranges), join_runs(k_ranges), cu_q,
                      cu_k, window, causal)


def join_runs(ranges: list[tuple[int, int]]) -> Runs:
    """Ranges in order, adjacent ones joined."""
    out: list[tuple[int, int]] = []
    for a, b in ranges:
        if out and out[-1][1] == a:
            out[-1] = (out[-1][0], b)
        else:
            out.append((a, b))
    return tuple(out)


# ------------------------------------------------------------------------- packing


def gather(x: torch.Tensor, runs: Runs, dim: int = 0) -> torch.Tensor:
    """The rows of ``runs`` back to back along ``dim``: a view for one run, else a copy."""
    parts = [x.narrow(dim, a, b - a) for a, b in runs]
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim)


def covers(calls: Sequence[KernelLaunch], rows: int, side: str) -> bool:
    """Whether ``calls`` touch each of ``rows`` rows on ``side`` ('q' or 'k') exactly once.

    Then their results can be written into uninitialised accumulators instead of being
    merged into (or added to) zeros: no fill, and one pass less over them.
    """
    spans = sorted((a, b) for c in calls for a, b in call_runs(c, side))
    return (bool(spans) and spans[0][0] == 0 and spans[-1][1] == rows
            and all(x[1] == y[0] for x, y in zip(spans, spans[1:])))


def call_runs(call: KernelLaunch, side: str) -> Runs:
    """The call's runs of rows on ``side`` ('q' or 'k'): a dense call's one block's."""
    if call.varlen:
        return call.q_runs if side == "q" else call.k_runs
    blk = call.blocks[0]
    return ((blk.q_start, blk.q_stop),) if side == "q" else ((blk.k_start, blk.k_stop),)
