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
    """A FIFO of (out, lse) kept from forwards without autograd, for their recomputes.

    Each entry remembers the call it was made for (``key``: the call's agreed signature
    without its autograd fields: shapes, dtype, flags, documents, layout), and ``take``
    hands it only to a call with the same key and an output of the same shape, dtype and
    device; anything else raises ValueError instead of returning another call's output.
    """

    def __init__(self) -> None:
        self._queue: collections.deque = collections.deque()

    def put(self, out: torch.Tensor, lse: torch.Tensor, key: object = None) -> None:
        self._queue.append((out.detach(), lse.detach(), key))

    def take(self, key: object = None) -> tuple[torch.Tensor, torch.Tensor] | None:
        if not self._queue:
            return None
        out, lse, kept_for = self._queue.popleft()
        if kept_for != key:
            self._queue.clear()  # the order is broken: nothing left in it can be trusted
            raise ValueError(f"AttentionKeep: the kept attention output was made by another "
                             f"call ({kept_for}) than the one asking for it ({key}); a "
                             f"layer's recomputes must come in the order of its forwards, "
                             f"with the same arguments")
        return out, lse

    def check(self, kept: tuple[torch.Tensor, torch.Tensor], like: torch.Tensor) -> None:
        """Raise unless the kept output has the shape, dtype and device of ``like``."""
        out = kept[0]
        if (out.shape, out.dtype, out.device) != (like.shape, like.dtype, like.device):
            self._queue.clear()
            raise ValueError(f"AttentionKeep: the kept output is {tuple(out.shape)} "
                             f"{out.dtype} on {out.device}, but this call's is "
                             f"{tuple(like.shape)} {like.dtype} on {like.device}")

    def __len__(self) -> int:
        return len(self._queue)
