"""Rematerialization-aware recompute: keep attention's output so the recompute skips the ring.

With full activation recompute every layer's forward runs twice, and so would the whole
attention ring, compute and communication. What the backward needs from attention is small:
its output and log-sum-exp, O(s h d) (DistFlashAttn's observation). ``AttentionKeep`` holds
them from the first forward (which runs without autograd, inside the checkpoint) until the
recompute of the same layer asks for them; the recompute then rebuilds the autograd node
from the kept tensors (``BurstAttentionFunction`` with ``kept``), with no ring traffic, and
the backward runs as usual.

Order: a layer's recomputes come in the order of its forwards (1F1B and interleaved
pipeline schedules both keep that order per layer), so one FIFO per layer pairs them. Only a
forward without autograd keeps (the checkpoint's first pass), and only a forward with
autograd takes; a layer that is not recomputed never keeps, and evaluation (the adapter
passes no keep outside training) never fills the queue.
"""
from __future__ import annotations

import collections

import torch


class AttentionKeep:
    """A FIFO of (out, lse) kept from forwards without autograd, for their recomputes."""

    def __init__(self) -> None:
        self._queue: collections.deque = collections.deque()

    def put(self, out: torch.Tensor, lse: torch.Tensor) -> None:
        self._queue.append((out.detach(), lse.detach()))

    def take(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        return self._queue.popleft() if self._queue else None

    def __len__(self) -> int:
        return len(self._queue)
