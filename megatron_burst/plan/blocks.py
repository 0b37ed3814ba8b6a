"""What a kernel computes: a ``Block`` of query rows against key rows under a ``Mask``.

Every mask is a *band* on key-minus-query position inside a document: causal keeps
j <= i, a window (left, right) keeps i-left <= j <= i+right. A block is a rectangle of local
query rows against local key rows, trimmed so every row and column sees something, with one
of three kinds of mask inside (full, causal, band). The schedule makes blocks; kernels run
them (``flash_window`` and ``of_window`` translate to flash-attn's windows).
"""
from __future__ import annotations

import dataclasses
from typing import Sequence

INF = 1 << 62
BLOCK_KINDS = ("full", "causal", "band")


@dataclasses.dataclass(frozen=True)
class Mask:
    causal: bool = False
    window: tuple[int, int] = (-1, -1)  # (left, right); -1 = unbounded

    @property
    def plain(self) -> bool:
        return self.window == (-1, -1)


@dataclasses.dataclass(frozen=True)
class Block:
    """One kernel call's worth: query rows ``q_start:q_stop`` against key rows ``k_start:k_stop``.

    ``kind`` is 'full' (every pair visible), 'causal' (square, key j visible to query i
    iff j <= i) or 'band' (visible iff lo <= j - i <= hi). Every row and every column of a
    block has at least one visible pair.
    """

    q_start: int
    q_stop: int
    k_start: int
    k_stop: int
    kind: str = "full"
    lo: int = 0
    hi: int = 0

    @property
    def causal(self) -> bool:
        return self.kind == "causal"

    @property
    def q(self) -> slice:
        return slice(self.q_start, self.q_stop)

    @property
    def k(self) -> slice:
        return slice(self.k_start, self.k_stop)

    @property
    def flash_window(self) -> tuple[int, int]:
        """(left, right) of flash-attn's bottom-right-aligned window that equals this block's
        mask ((-1, -1): every pair, (-1, 0): causal). Flash aligns query i with key
        i + m - n; blocks are trimmed so that a band's two values are >= 0 (the last row and
        the last column each see something)."""
        if self.kind == "full":
            return -1, -1
        if self.kind == "causal":
            return -1, 0
        n, m = self.q_stop - self.q_start, self.k_stop - self.k_start
        return (m - n) - self.lo, self.hi - (m - n)

    @staticmethod
    def of_window(n: int, m: int, window: tuple[int, int], causal: bool) -> "Block":
        """The n x m block flash computes under its bottom-right ``window`` (and
        ``causal``), trimmed to a kind: the inverse of ``flash_window``."""
        if causal:
            window = (window[0], 0)
        left, right = window
        lo = (m - n) - left if left >= 0 else -(n - 1)
        hi = (m - n) + right if right >= 0 else m - 1
        lo, hi = max(lo, -(n - 1)), min(hi, m - 1)
        if (lo, hi) == (-(n - 1), m - 1):
            return Block(0, n, 0, m, "full")
        if n == m and (lo, hi) == (-(n - 1), 0):
            return Block(0, n, 0, m, "causal")
        return Block(0, n, 0, m, "band", lo, hi)

    def describe(self) -> str:
        """e.g. 'band block of 64 x 80 (key - query in [-16, 0])'."""
        n, m = self.q_stop - self.q_start, self.k_stop - self.k_start
        mask = f" (key - query in [{self.lo}, {self.hi}])" if self.kind == "band" else ""
        return f"{self.kind} block of {n} x {m}{mask}"

    @property
    def area(self) -> int:
        """Visible (query, key) pairs: what the kernel spends FLOPs on."""
        n, m = self.q_stop - self.q_start, self.k_stop - self.k_start
        if self.kind == "full":
            return n * m
        lo, hi = (-(n - 1), 0) if self.kind == "causal" else (self.lo, self.hi)
        return _pairs_up_to(n, m, hi) - _pairs_up_to(n, m, lo - 1)


def as_one(blocks: Sequence[Block]) -> Block | None:
    """``blocks`` (disjoint, as a schedule makes them) as one full, causal or band block over
    their bounding rectangle where together they are exactly that; else None.

    Why: a causal slice mask dealt two chunks a rank (the ``area`` layout, as zigzag deals
    them) is three blocks on a rank's own keys (each chunk causal on itself, the later chunk
    full on the earlier) that together are one causal triangle in the shard's row order.
    One kernel call on twice the rows runs faster than three, and its output needs no merge
    (a plain zigzag sequence's schedule makes that one block itself). A window's slices cut
    its band where it meets the sequence's ends (the first w rows see a causal triangle, the
    rest a band): on a rank's own keys they are one band again, one call where there were two.

    Exact by counting: every block lies in the bounding rectangle and in the band of the
    smallest to the largest key - query offset any of them holds, so their union is inside
    that band; disjoint, they are all of it where their areas add up to its area."""
    if len(blocks) < 2:
        return None
    q0, q1 = min(b.q_start for b in blocks), max(b.q_stop for b in blocks)
    k0, k1 = min(b.k_start for b in blocks), max(b.k_stop for b in blocks)
    n, m = q1 - q0, k1 - k0
    area = sum(b.area for b in blocks)
    if area == n * m:
        return Block(q0, q1, k0, k1, "full")
    if n == m and area == n * (n + 1) // 2 and all(_top(b) <= k0 - q0 for b in blocks):
        return Block(q0, q1, k0, k1, "causal")  # inside the triangle, and all of it
    lo = max(min(_bottom(b) for b in blocks) - (k0 - q0), -(n - 1))
    hi = min(max(_top(b) for b in blocks) - (k0 - q0), m - 1)
    band = Block(q0, q1, k0, k1, "band", lo, hi)
    return band if band.area == area else None  # (full and causal bands returned above)


MAX_COALESCED, MAX_RUN = 64, 8  # bounds on the search (blocks of a step, causal blocks a run)


def coalesced(blocks: Sequence[Block]) -> tuple[Block, ...]:
    """``blocks`` with every run of causal blocks on one diagonal (each starting where the
    last ends, in rows and keys), and the blocks between them, made one causal block where
    together they are exactly that (``as_one``); the rest as they are. A shared question's
    first documents, or a document cut across a rank's chunks, are such runs. Where the
    blocks that are not full are one band together, that band and the full blocks.

    A band is made only of band and causal blocks: the pieces of a window. A full block
    beside a band on the same rows (a long document that sees every earlier key) stays
    apart: one GPU runs it at the dense kernel's rate, where a band of 2,048+ rows goes to
    FlexAttention (``kernels.flex``), which ran dense work 0.7x as fast on 2x H200."""
    one = as_one(blocks)
    if one is not None and (one.kind != "band" or all(b.kind != "full" for b in blocks)):
        return (one,)
    if len(blocks) > MAX_COALESCED or all(b.kind == "causal" for b in blocks):
        return tuple(blocks)  # many (a pack's documents), or nothing between the diagonals
    masked = [b for b in blocks if b.kind != "full"]  # (all of them: ``one`` said no)
    band = as_one(masked) if 1 < len(masked) < len(blocks) else None
    if band is not None and band.kind == "band":  # a global window's band beside its columns
        return (band, *(b for b in blocks if b.kind == "full"))
    diagonal = sorted((b for b in blocks if b.kind == "causal"), key=lambda b: b.q_start)
    fillers = [(b, b.area) for b in blocks if b.kind != "causal"]
    upto = [0]  # the diagonal's areas, summed from its start
    for b in diagonal:
        upto.append(upto[-1] + b.area)
    out, used, i = [], set(), 0
    while i < len(diagonal):
        j = i + 1  # the run diagonal[i:j]: each causal block where the last one ends
        while j < len(diagonal) and (diagonal[j].q_start, diagonal[j].k_start) == (
                diagonal[j - 1].q_stop, diagonal[j - 1].k_stop):
            j += 1
        for end in range(min(j, i + MAX_RUN), i + 1, -1):  # the longest from i that is one
            inside = _triangle(diagonal[i:end], upto[end] - upto[i], fillers, blocks)
            if inside:
                out.append(Block(inside[0].q_start, inside[-1].q_stop, inside[0].k_start,
                                 inside[-1].k_stop, "causal"))
                used.update(inside)  # blocks are values, disjoint: no two equal
                i = end
                break
        else:
            i += 1
    return (*out, *(b for b in blocks if b not in used)) if out else tuple(blocks)


def carved(block: Block, grain: int) -> tuple[list[Block], list[Block]]:
    """``block`` as (cores, rest): cores are full or causal blocks whose sides are ``grain``
    times a power of two, so a dense kernel that builds a graph per shape (cuDNN) meets few
    shapes whatever the mask (``thresholds.SHAPE_FREE_GRAIN``); the rest are the strips
    narrower than ``grain`` and any band, as they were. Each visible pair of ``block`` lies
    in exactly one piece: a full block is its top-left core, the strip right of it and the
    rows below; a causal square of n is its bottom-right causal core of s, the full rows
    beside that core (every key left of it is before their diagonal) and the causal square
    of n - s above."""
    cores: list[Block] = []
    rest: list[Block] = []
    todo = [block]
    while todo:
        b = todo.pop()
        n, m = b.q_stop - b.q_start, b.k_stop - b.k_start
        if b.kind == "full" and min(n, m) >= grain:
            r, c = _side(n, grain), _side(m, grain)
            cores.append(Block(b.q_start, b.q_start + r, b.k_start, b.k_start + c))
            if c < m:
                todo.append(Block(b.q_start, b.q_start + r, b.k_start + c, b.k_stop))
            if r < n:
                todo.append(Block(b.q_start + r, b.q_stop, b.k_start, b.k_stop))
        elif b.kind == "causal" and n >= grain:
            s = _side(n, grain)
            cores.append(Block(b.q_stop - s, b.q_stop, b.k_stop - s, b.k_stop, "causal"))
            if n > s:
                todo.append(Block(b.q_stop - s, b.q_stop, b.k_start, b.k_stop - s))
                todo.append(Block(b.q_start, b.q_stop - s, b.k_start, b.k_stop - s, "causal"))
        else:
            rest.append(b)
    return cores, rest


def _side(n: int, grain: int) -> int:
    """The largest ``grain`` x 2^k that is at most ``n`` (``n`` >= ``grain``)."""
    return grain << ((n // grain).bit_length() - 1)


def _triangle(run: Sequence[Block], run_area: int, fillers: Sequence[tuple[Block, int]],
              blocks: Sequence[Block]) -> list[Block]:
    """The blocks inside ``run``'s square (sorted, the run's first and last at the ends)
    when together they are its causal triangle; else []. The areas are compared first (the
    cheap test that fails for almost every run; ``run_area``: the run's), ``as_one``
    decides."""
    q0, q1, k0, k1 = run[0].q_start, run[-1].q_stop, run[0].k_start, run[-1].k_stop
    n = q1 - q0
    if k1 - k0 != n:
        return []

    def box(b: Block) -> bool:
        return q0 <= b.q_start and b.q_stop <= q1 and k0 <= b.k_start and b.k_stop <= k1

    area = run_area + sum(a for b, a in fillers if box(b))
    if area != n * (n + 1) // 2:
        return []
    inside = [b for b in blocks if box(b)]
    one = as_one(inside)
    if one is None or one.kind != "causal":  # (an inverse triangle has the same area)
        return []
    return sorted(inside, key=lambda b: (b.q_start, b.k_start))


def _bottom(b: Block) -> int:
    """The smallest key - query row offset among ``b``'s visible pairs."""
    if b.kind == "band":
        return b.lo + b.k_start - b.q_start
    return b.k_start - (b.q_stop - 1)  # full or causal: the last row's first key


def _top(b: Block) -> int:
    """The largest key - query row offset among ``b``'s visible pairs."""
    if b.kind == "full":
        return b.k_stop - 1 - b.q_start
    return (0 if b.kind == "causal" else b.hi) + b.k_start - b.q_start


def _pairs_up_to(n: int, m: int, x: int) -> int:
    """Pairs (i, j), 0 <= i < n, 0 <= j < m, with j - i <= x: sum_i clamp(i + x + 1, 0, m),
    in closed form (a per-row loop made every new document pack's planning grow with its
    rows)."""
    a = x + 1
    first = min(max(1 - a, 0), n)  # first row that sees a key
    full = min(max(m - a, 0), n)  # first row that sees all m keys
    return (full - first) * (first + full - 1) // 2 + (full - first) * a + (n - full) * m


def most_per_row(spans: Sequence[tuple[int, int]]) -> int:
    """The most of ``spans`` ([start, stop) row ranges, each counted as often as it appears)
    that cover any one row: how many partial results that row's gradient gathers."""
    edges = sorted([(a, 1) for a, _ in spans] + [(b, -1) for _, b in spans])
    most = held = 0
    for _, change in edges:  # at one row, ends (-1) sort before starts (+1)
        held += change
        if held > most:
            most = held
    return most


def rows_over(spans: Sequence[tuple[int, int]], most: int) -> tuple[tuple[int, int], ...]:
    """The rows that more than ``most`` of ``spans`` cover (each span counted as often as it
    appears), as sorted, disjoint [start, stop) runs: with ``most`` 2, the home rows whose
    partial results need an fp32 accumulator (``home_output.WideRows``)."""
    edges = sorted([(a, 1) for a, _ in spans] + [(b, -1) for _, b in spans])
    runs: list[tuple[int, int]] = []
    held, start = 0, None
    for at, change in edges:  # at one row, ends (-1) sort before starts (+1)
        held += change
        if held > most and start is None:
            start = at
        elif held <= most and start is not None:
            if runs and runs[-1][1] == start:  # (a span that ends where another starts)
                runs[-1] = (runs[-1][0], at)
            elif at > start:
                runs.append((start, at))
            start = None
    return tuple(runs)


def one_partial(last_step: int, spans: Sequence[tuple[int, int]]) -> bool:
    """Whether a travelling gradient accumulator takes at most one kernel partial per row:
    one holder (its payload's last step is 1, so it goes home from there) whose calls touch
    each row once (``spans``: their row ranges on the payload's side). Such an accumulator
    travels in the inputs' dtype: the plan decides by this (``call_plan.PassPlan.wire``),
    the byte contract counts by it (``topology.rank_bytes``)."""
    return last_step == 1 and most_per_row(spans) <= 1


def block_spans(blocks: Sequence[Block], side: str) -> list[tuple[int, int]]:
    """The query ('q') or key ('k') row range of each block."""
    return [(b.q_start, b.q_stop) if side == "q" else (b.k_start, b.k_stop) for b in blocks]
