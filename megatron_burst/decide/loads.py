"""Which load 'auto' decides a call from, and under which key: one decision per call shape and
work, not one per micro-batch.

Why apart: the rule is about the data's rhythm, not the time model. Training feeds a new
document pack (or a new mask built from one) every micro-batch from one mix; deciding (and
checking, ``attention.decision_check``) per pack cost a timed check every call (issue 41,
2x H200: 89 ms a new 8K pack). So a decision's key holds the call's shape and a ``work_key``,
and its load (``pack_load``) is the first seen under that key (``first_load``). Every rank
sees the same calls in the same order (their masks and packs are checked to agree), so every
rank keys and keeps the same.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Hashable

if TYPE_CHECKING:  # pack_load reads plan (numpy): not for the launch CLI's import
    from .pack_load import PackLoad

WORKS_PER_SHAPE = 4  # distinct works (masks, windows) a call shape is decided for, each alone
FOLLOWS_THE_DATA = "follows the data"
_WORKS: dict[tuple, list] = {}  # call shape -> the works keyed on their own there
_FIRST: dict[tuple, "PackLoad | None"] = {}  # decision key -> the first load seen for it
HISTORY = 256  # keys remembered by each (the oldest dropped: the same on every rank)


def work_key(shape: tuple, work: Hashable) -> Hashable:
    """What a decision's key holds of a call's work: ``work`` itself (a window, a slice mask:
    a model whose layers have two masks is decided for each) for the first
    ``WORKS_PER_SHAPE`` distinct works of a call shape; past them the shape's masks follow the
    data (a new one every micro-batch) and share one key, so the load of the first of them,
    as a pack's documents do (a pack's documents under one window are one work)."""
    seen = _WORKS.setdefault(shape, [])
    if work in seen:
        return work
    if len(seen) >= WORKS_PER_SHAPE:
        return FOLLOWS_THE_DATA
    seen.append(work)
    if len(_WORKS) > HISTORY:
        _WORKS.pop(next(iter(_WORKS)))
    return work


def first_load(key: tuple, load: "Callable[[], PackLoad | None] | None") -> "PackLoad | None":
    """The load a decision is made from: the first call's of its key (``load()`` is called
    for that one only), for every later call of the key."""
    if load is None:
        return None
    if key not in _FIRST:
        if len(_FIRST) >= HISTORY:
            _FIRST.pop(next(iter(_FIRST)))
        _FIRST[key] = load()
    return _FIRST[key]


def clear() -> None:
    """Forget every key (tests, and benchmarks that decide each case as a fresh run would)."""
    _WORKS.clear()
    _FIRST.clear()
