"""The mask families of the Long-Context Attention Benchmark, as ``SliceMask`` builders.

LongCA-bench (arXiv 2510.17896) measures distributed attention over these masks, because
masks decide a method's efficiency. Each builder takes document lengths (their sum is the
sequence) or the sequence's length, and the family's own knob:

- ``full`` / ``causal``: the whole sequence;
- ``full_document`` / ``causal_document``: full or causal within each document;
- ``shared_question``: document 0 is the question; documents 0 and 1 form one causal
  slice; every later document is causal on itself and sees the whole question;
- ``causal_blockwise``: causal per document, but the last document sees everything before;
- ``prefix_lm_causal``: the first ``prefix`` tokens see each other fully, the rest are
  causal over everything (bottom-right: each later query sees the prefix and its past);
- ``prefix_lm_document``: one prefix length applied in every document (a document no
  longer than it is full);
- ``sliding_window`` (w, w) and ``sliding_window_causal`` (w, 0): query i sees keys
  i - w .. i + w (i - w .. i);
- ``global_sliding_window``: every query sees the first g keys, the first g queries see
  everything, and a (w, w) window elsewhere;
- ``block_causal_document``: documents cut into blocks of ``block`` tokens; a block sees
  its document from the start up to its own end (full inside).

``family(name, lens, ...)`` builds any of them by name (``FAMILIES``).
"""
from __future__ import annotations

import itertools
from typing import Callable, Sequence

from .slices import SliceMask


def _starts(lens: Sequence[int]) -> list[int]:
    return [0, *itertools.accumulate(lens)]


def full(total: int) -> SliceMask:
    return SliceMask([(0, total)], [(0, total)], ["full"])


def causal(total: int) -> SliceMask:
    return SliceMask([(0, total)], [(0, total)], ["causal"])


def documents(lens: Sequence[int], kind: str = "causal") -> SliceMask:
    """Each document attends within itself under ``kind`` (today's document masks)."""
    cu = _starts(lens)
    ranges = [(a, b) for a, b in zip(cu, cu[1:]) if b > a]
    return SliceMask(ranges, ranges, [kind] * len(ranges))


def full_document(lens: Sequence[int]) -> SliceMask:
    return documents(lens, "full")


def causal_document(lens: Sequence[int]) -> SliceMask:
    return documents(lens, "causal")


def shared_question(lens: Sequence[int]) -> SliceMask:
    """Document 0 the question, 0 + 1 one causal slice, later documents causal on themselves
    and full on the question (as LongCA-bench's generator)."""
    cu, total = _starts(lens), sum(lens)
    if len(lens) < 2:
        return causal(total)
    q, k, kinds = [(0, cu[2])], [(0, cu[2])], ["causal"]
    if len(lens) > 2:
        q.append((cu[2], total))
        k.append((0, cu[1]))
        kinds.append("full")
    for a, b in zip(cu[2:], cu[3:]):
        q.append((a, b))
        k.append((a, b))
        kinds.append("causal")
    return SliceMask(q, k, kinds)


def causal_blockwise(lens: Sequence[int]) -> SliceMask:
    """Causal per document; the last document's keys are the whole sequence."""
    cu, total = _starts(lens), sum(lens)
    q = [(a, b) for a, b in zip(cu, cu[1:])]
    k = q[:-1] + [(0, total)]
    return SliceMask(q, k, ["causal"] * len(q))


def prefix_lm_causal(total: int, prefix: int) -> SliceMask:
    if prefix >= total:
        return full(total)
    return SliceMask([(0, prefix), (prefix, total)], [(0, prefix), (0, total)],
                     ["full", "causal"])


def prefix_lm_document(lens: Sequence[int], prefix: int) -> SliceMask:
    q, k, kinds = [], [], []
    for a, b in zip(_starts(lens), _starts(lens)[1:]):
        if prefix < b - a:
            q += [(a, a + prefix), (a + prefix, b)]
            k += [(a, a + prefix), (a, b)]
            kinds += ["full", "causal"]
        else:
            q.append((a, b))
            k.append((a, b))
            kinds.append("full")
    return SliceMask(q, k, kinds)


def window_slices(start: int, stop: int, left: int, right: int
                  ) -> tuple[list[tuple[int, int]], list[tuple[int, int]], list[str]]:
    """Slices of a sliding window on the square [start, stop): query i sees keys i - left
    .. i + right (-1: unbounded). Rows are cut where the window meets the square's edges;
    in each run of rows it is one slice: bi_causal where neither edge cuts it, causal where
    the first key does, inv_causal where the last does, full where both do."""
    n = stop - start
    left = n if left < 0 else min(left, n)
    right = n if right < 0 else min(right, n)
    cuts = sorted({0, n, left, max(n - right, 0)})
    q, k, kinds = [], [], []
    for a, b in zip(cuts, cuts[1:]):
        low, high = a < left, b > n - right  # the first key cuts these rows / the last
        k0 = 0 if low else a - left
        k1 = n if high else b + right
        q.append((start + a, start + b))
        k.append((start + k0, start + k1))
        kinds.append({(False, False): "bi_causal", (True, False): "causal",
                      (False, True): "inv_causal", (True, True): "full"}[(low, high)])
    return q, k, kinds


def sliding_window(total: int, window: int) -> SliceMask:
    return SliceMask(*window_slices(0, total, window, window))


def sliding_window_causal(total: int, window: int) -> SliceMask:
    return SliceMask(*window_slices(0, total, window, 0))


def global_sliding_window(total: int, global_size: int, window: int) -> SliceMask:
    g = min(global_size, total)
    q, k, kinds = window_slices(g, total, window, window)
    return SliceMask([(0, total), (0, g), *q], [(0, g), (g, total), *k],
                     ["full", "full", *kinds])


def block_causal_document(lens: Sequence[int], block: int) -> SliceMask:
    q, k = [], []
    for a, b in zip(_starts(lens), _starts(lens)[1:]):
        for s in range(a, b, block):
            q.append((s, min(s + block, b)))
            k.append((a, min(s + block, b)))
    return SliceMask(q, k, ["full"] * len(q))


FAMILIES: dict[str, Callable[..., SliceMask]] = {
    "full": lambda lens, **_: full(sum(lens)),
    "causal": lambda lens, **_: causal(sum(lens)),
    "full_document": lambda lens, **_: full_document(lens),
    "causal_document": lambda lens, **_: causal_document(lens),
    "shared_question": lambda lens, **_: shared_question(lens),
    "causal_blockwise": lambda lens, **_: causal_blockwise(lens),
    "prefix_lm_causal": lambda lens, prefix, **_: prefix_lm_causal(sum(lens), prefix),
    "prefix_lm_document": lambda lens, prefix, **_: prefix_lm_document(lens, prefix),
    "sliding_window": lambda lens, window, **_: sliding_window(sum(lens), window),
    "sliding_window_causal": lambda lens, window, **_: sliding_window_causal(sum(lens),
                                                                             window),
    "global_sliding_window": lambda lens, window, global_size, **_: global_sliding_window(
        sum(lens), global_size, window),
    "block_causal_document": lambda lens, block, **_: block_causal_document(lens, block),
}


def family(name: str, lens: Sequence[int], *, prefix: int = 0, window: int = 0,
           global_size: int = 0, block: int = 1) -> SliceMask:
    """The mask of family ``name`` over documents ``lens`` with the family's knob."""
    if name not in FAMILIES:
        raise ValueError(f"name must be one of {tuple(FAMILIES)}, got {name!r}")
    return FAMILIES[name](tuple(lens), prefix=prefix, window=window, global_size=global_size,
                          block=block)
