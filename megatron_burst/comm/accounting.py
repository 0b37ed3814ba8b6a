"""Byte accounting: what this rank sends, counted per pass.

Why: the cost of an algorithm is what each of its passes sends, and the only honest count is
the one taken where the bytes leave. Every send of the ring (``messages.PeerComm``) and of
the all-to-all (``exchange``) reports here (``record_sent``), so that ``count_comm()`` can
show what each pass of an algorithm costs.
"""
from __future__ import annotations

import contextlib
import dataclasses
from typing import Iterator


@dataclasses.dataclass
class CommStats:
    """Bytes this rank sent while the ``count_comm()`` block was open, split by pass."""

    forward_bytes: int = 0
    backward_bytes: int = 0
    forward_messages: int = 0
    backward_messages: int = 0

    @property
    def total_bytes(self) -> int:
        return self.forward_bytes + self.backward_bytes


_ACTIVE: list[CommStats] = []


@contextlib.contextmanager
def count_comm() -> Iterator[CommStats]:
    """Count the bytes this rank sends inside the block (nested blocks all see them)."""
    stats = CommStats()
    _ACTIVE.append(stats)
    try:
        yield stats
    finally:
        # By identity: CommStats is a dataclass, so list.remove() would compare values and
        # could drop an enclosing counter that happens to hold the same counts.
        _ACTIVE[:] = [s for s in _ACTIVE if s is not stats]


def record_sent(nbytes: int, phase: str) -> None:
    """Add ``nbytes`` sent in ``phase`` ('forward' or 'backward') to every open counter."""
    for stats in _ACTIVE:
        if phase == "forward":
            stats.forward_bytes += nbytes
            stats.forward_messages += 1
        else:
            stats.backward_bytes += nbytes
            stats.backward_messages += 1


@contextlib.contextmanager
def captured() -> Iterator[CommStats]:
    """What a CUDA graph's capture posts, counted apart from the open counters: nothing leaves
    until the graph is replayed, and each replay counts it then (``replayed``)."""
    saved, stats = _ACTIVE[:], CommStats()
    _ACTIVE[:] = [stats]
    try:
        yield stats
    finally:
        _ACTIVE[:] = saved


def replayed(sent: CommStats) -> None:
    """Add one replay's sends (what its capture counted) to every open counter."""
    for stats in _ACTIVE:
        stats.forward_bytes += sent.forward_bytes
        stats.backward_bytes += sent.backward_bytes
        stats.forward_messages += sent.forward_messages
        stats.backward_messages += sent.backward_messages
