"""Rematerialization-aware recompute: keep attention's output so the recompute skips the ring.

With full activation recompute every layer's forward runs twice, and so would the whole
attention ring, compute and communication. What the backward needs from attention is small:
its output and log-sum-exp, O(s h d) (DistFlashAttn's observation). ``AttentionKeep`` holds
them from the first forward (which runs without autograd, inside the checkpoint) until the
recompute of the same forward asks for them; the recompute then rebuilds the autograd node
from the kept tensors (``BurstAttentionFunction`` with ``kept``), with no ring traffic, and
the backward runs as usual.

A kept output belongs to the forward that made it, by construction:

- **Matched by value.** Each entry carries a fingerprint of the inputs it was computed from
  (``fingerprint``: random projections of q, k and v, with their scale) and the call's
  signature. A recompute takes only an entry whose signature equals its own and whose
  fingerprint matches its own inputs, so it gets the attention of *its* q, k, v or none.
  Where no entry matches on every rank of the group, the ranks run the ring as usual:
  whether to take is agreed by one small all-reduce, so no rank runs a ring its peers skip.
- **Stale entries go.** A recompute happens inside the backward (autograd's graph task);
  a layer's recomputes come in the order of its forwards (1F1B and interleaved pipelines
  keep it), so entries older than the one a recompute takes were made by forwards whose
  backward never came (a validation pass without ``eval()``, a skipped non-finite step, an
  OOM retry): they are dropped. A forward with autograd outside the backward means the
  layer is not being recomputed: everything kept is dropped. And a queue never holds more
  than ``limit`` entries (the oldest go first; a recompute that then finds nothing runs
  the ring, exact and only slower).

What it costs: the fingerprint is one pass over q, k and v on the first forward and on the
recompute, and deciding a take reads one small tensor on the host (the GPU is waited for
once per recomputed layer) after one all-reduce of one integer.
"""
from __future__ import annotations

import collections
import math

import torch
import torch.distributed as dist

from ..comm.waits import wait_bounded

TOLERANCE = 1e-3  # relative to a tensor's projected norm: recompute noise is far smaller,
# two different inputs differ by about their norm (random projections)


def in_backward() -> bool:
    """Whether this runs inside autograd's backward (where a checkpoint recomputes)."""
    return torch._C._current_graph_task_id() != -1


def _weights(n: int, phase: float, device: torch.device) -> torch.Tensor:
    """n deterministic pseudo-random weights in [-1, 1], made on ``device`` (no cache)."""
    idx = torch.arange(n, device=device, dtype=torch.float64)
    return torch.cos(idx * (math.sqrt(5) - 1) * 0.5 * 2 * math.pi + phase).float()


def fingerprint(tensors: tuple[torch.Tensor, ...]) -> torch.Tensor:
    """Three fp32 numbers per tensor that tell inputs apart: two random projections of all its
    elements and the norm of its projected rows. Deterministic for equal inputs (any
    strides); computed on the tensors' device without waiting for it."""
    parts = []
    for t in tensors:
        d = t.shape[-1]
        w = torch.stack([_weights(d, 0.3, t.device), _weights(d, 1.7, t.device)], 1)
        proj = torch.matmul(t.detach(), w.to(t.dtype)).float().reshape(-1, 2)  # [n, 2]
        u = _weights(proj.shape[0], 0.9, t.device)
        parts.append(torch.stack([(proj[:, 0] * u).sum(), (proj[:, 1] * u.flip(0)).sum(),
                                  torch.linalg.vector_norm(proj)]))
    return torch.cat(parts)


def _matches(kept: torch.Tensor, now: torch.Tensor) -> torch.Tensor:
    """[entries] bool: which kept fingerprints equal ``now`` within ``TOLERANCE``."""
    k3, n3 = kept.view(kept.shape[0], -1, 3), now.view(1, -1, 3)
    scale = torch.maximum(k3[..., 2], n3[..., 2]).unsqueeze(-1)
    return ((k3 - n3).abs() <= TOLERANCE * scale + 1e-30).all(-1).all(-1)


class AttentionKeep:
    """Attention outputs kept from forwards without autograd, each for the recompute of the
    same forward (see the module docstring). One per layer."""

    def __init__(self, limit: int = 8) -> None:
        if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
            raise ValueError(f"AttentionKeep(limit=...) must be a positive int, got {limit!r}")
        self.limit = limit
        self._queue: collections.deque = collections.deque()  # (out, lse, key, fingerprint)

    def put(self, out: torch.Tensor, lse: torch.Tensor, key: object,
            inputs: tuple[torch.Tensor, ...]) -> None:
        """Keep (out, lse) of a call without autograd on ``inputs`` (its q, k, v)."""
        self._queue.append((out.detach(), lse.detach(), key, fingerprint(inputs)))
        while len(self._queue) > self.limit:
            self._queue.popleft()

    def take(self, key: object, inputs: tuple[torch.Tensor, ...], group) -> tuple | None:
        """(out, lse) kept for a call with signature ``key`` on these very ``inputs``, if
        every rank of ``group`` holds its own; else None (the caller runs the ring). Entries
        older than the one found are dropped, and so is the one found."""
        candidates = [i for i, e in enumerate(self._queue) if e[2] == key]
        now = fingerprint(inputs)
        found = torch.zeros(len(candidates) + 1, dtype=torch.int64, device=now.device)
        if candidates:
            kept = torch.stack([self._queue[i][3] for i in candidates])
            found[:-1] = _matches(kept, now).to(torch.int64)
        found[-1] = found[:-1].max() if candidates else 0  # this rank has one
        flags = _all_ranks_have(found, group).tolist()
        index = next((c for c, hit in zip(candidates, flags) if hit), None)
        if index is None:
            return None
        for _ in range(index):  # made by forwards whose recompute never came
            self._queue.popleft()
        out, lse, _, _ = self._queue.popleft()
        return (out, lse) if flags[-1] else None

    def clear(self) -> None:
        self._queue.clear()

    def __len__(self) -> int:
        return len(self._queue)


def _all_ranks_have(found: torch.Tensor, group) -> torch.Tensor:
    """``found`` with its last entry replaced by its minimum over the group's ranks."""
    if not dist.is_initialized() or dist.get_world_size(group) < 2:
        return found
    backend = str(dist.get_backend(group))
    flag = found[-1:].clone()
    if "nccl" in backend and "gloo" not in backend:
        flag = flag.cuda()
    elif flag.is_cuda:
        flag = flag.cpu()
    work = dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=group, async_op=True)
    wait_bounded(work, flag.device, "for the other ranks to decide on a kept attention output",
                 why="a rank failed or makes other attention calls than its peers")
    found = found.clone()
    found[-1] = flag.to(found.device)[0]
    return found
