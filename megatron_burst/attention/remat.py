"""Rematerialization-aware recompute: keep attention's output so the recompute skips the ring.

With full activation recompute every layer's forward runs twice, and so would the whole
attention ring, compute and communication. What the backward needs from attention is small:
its output and log-sum-exp, O(s h d) (DistFlashAttn's observation). ``AttentionKeep`` holds
them from the first forward (which runs without autograd, inside the checkpoint) until the
recompute of the same forward asks for them; the recompute then rebuilds the autograd node
from the kept tensors (``BurstAttentionFunction`` with ``kept``), with no ring traffic, and
the backward runs as usual.

A kept output belongs to the forward that made it, by construction:

- **Matched by value, bit for bit.** Each entry carries a hash of the bytes of the inputs
  it was computed from (``fingerprint``) and the call's signature. A recompute takes only an
  entry whose signature equals its own and whose hash equals its own inputs' hash under the
  entry's own coefficients, so it gets the attention of *its* q, k, v or none. The hash is
  a polynomial over the prime field of P = 2^31 - 1 whose coefficients are drawn fresh from
  the OS's entropy for every kept output, after its inputs exist: for ANY two inputs that
  differ in any bit, one projection agrees with probability at most 1/256 + 1/P (a nonzero
  linear form in the byte coefficients, then in the row coefficients: Schwartz-Zippel), so
  the eight independent ones of a hash collide with probability below 6e-20 per check. No
  input can be built to collide (the coefficients are drawn after it). A recompute whose
  inputs differ in any bit from its first forward's runs the ring: exact, only slower.
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

What it costs: the fingerprint is one int8 matrix product over the bytes of q, k and v (no
copy of a contiguous tensor) on the first forward and on the recompute, and deciding a take
reads one small tensor on the host (the GPU is waited for once per recomputed layer) after
one all-reduce of one integer.
"""
from __future__ import annotations

import collections
import os

import torch

from ..comm import consensus

P = 2 ** 31 - 1  # the hash's prime field: products of a residue and a byte sum fit int64
PROJECTIONS = 8  # independent projections per tensor: (1/256 + 1/P)^8 < 6e-20
_MAX_ROW_BYTES = 2 ** 17  # an int32 row sum of bytes x byte coefficients stays below 2^31


def in_backward() -> bool:
    """Whether this runs inside autograd's backward (where a checkpoint recomputes)."""
    return torch._C._current_graph_task_id() != -1


def new_seed() -> int:
    """Fresh coefficients' seed, from the OS's entropy (never from torch's seeded state,
    which the inputs may depend on)."""
    return int.from_bytes(os.urandom(8), "little") >> 1


def _byte_rows(t: torch.Tensor) -> torch.Tensor:
    """``t``'s bytes as int8 rows [n, last dim's bytes], by shape alone (so a strided view
    and its contiguous copy hash alike): a view where the rows are contiguous, else a copy
    (K and V as views of a fused QKV)."""
    t = t.detach()
    if t.dim() == 0 or t.stride(-1) != 1:
        t = t.contiguous()
    rows = t.reshape(-1, t.shape[-1]) if t.dim() != 1 else t.reshape(1, -1)
    rows = rows.view(torch.int8)
    return rows if rows.is_contiguous() else rows.contiguous()


def _row_sums(x: torch.Tensor, coef: torch.Tensor) -> torch.Tensor:
    """x [n, c] int8 @ coef [c, m] int8, exactly, as int64: the int8 kernel where its shapes
    allow (int32 sums, exact below 2^31), else float64 (exact below 2^53)."""
    n, c = x.shape
    if n > 16 and c % 8 == 0 and c <= _MAX_ROW_BYTES:
        try:  # (the same integers either way: only the speed differs)
            return torch._int_mm(x, coef.t().contiguous().t()).long()
        except RuntimeError:  # a build or device without this int8 kernel
            pass
    return (x.double() @ coef.double()).long()


def _hash(t: torch.Tensor, seed: int) -> torch.Tensor:
    """[PROJECTIONS] int64 in [0, P): sum_i r_i sum_j c_j x_ij mod P over ``t``'s bytes x,
    with c (bytes) and r (residues) drawn from ``seed`` on ``t``'s device."""
    x = _byte_rows(t)
    gen = torch.Generator(device=x.device).manual_seed(seed)
    coef = torch.randint(-128, 128, (x.shape[1], PROJECTIONS), generator=gen,
                         device=x.device, dtype=torch.int8)
    r = torch.randint(0, P, (x.shape[0], PROJECTIONS), generator=gen, device=x.device,
                      dtype=torch.int64)
    y = torch.remainder(_row_sums(x, coef), P)  # residues below 2^31: y * r below 2^62
    return torch.remainder(torch.remainder(y * r, P).sum(0), P)


def fingerprint(tensors: tuple[torch.Tensor, ...], seed: int) -> torch.Tensor:
    """[len(tensors) * PROJECTIONS] int64: each tensor's hash under ``seed``'s coefficients
    (module docstring: equal for equal bytes; for unequal ones, equal with probability
    below 6e-20 whatever they are). Computed on the tensors' device without waiting."""
    return torch.cat([_hash(t, seed + i) for i, t in enumerate(tensors)])


class AttentionKeep:
    """Attention outputs kept from forwards without autograd, each for the recompute of the
    same forward (see the module docstring). One per layer."""

    def __init__(self, limit: int = 8) -> None:
        if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
            raise ValueError(f"AttentionKeep(limit=...) must be a positive int, got {limit!r}")
        self.limit = limit
        # (out, lse, key, seed, fingerprint): each entry hashed under its own fresh seed
        self._queue: collections.deque = collections.deque()

    def put(self, out: torch.Tensor, lse: torch.Tensor, key: object,
            inputs: tuple[torch.Tensor, ...]) -> None:
        """Keep (out, lse) of a call without autograd on ``inputs`` (its q, k, v)."""
        seed = new_seed()
        self._queue.append((out.detach(), lse.detach(), key, seed, fingerprint(inputs, seed)))
        while len(self._queue) > self.limit:
            self._queue.popleft()

    def take(self, key: object, inputs: tuple[torch.Tensor, ...], group) -> tuple | None:
        """(out, lse) kept for a call with signature ``key`` on these very ``inputs``, if
        every rank of ``group`` holds its own; else None (the caller runs the ring). Entries
        older than the one found are dropped, and so is the one found."""
        candidates = [i for i, e in enumerate(self._queue) if e[2] == key]
        device = inputs[0].device
        found = torch.zeros(len(candidates) + 1, dtype=torch.int64, device=device)
        for slot, i in enumerate(candidates):  # each under its own entry's coefficients
            _, _, _, seed, kept = self._queue[i]
            found[slot] = (fingerprint(inputs, seed) == kept).all()
        found[-1] = found[:-1].max() if candidates else 0  # this rank has one
        flags = _all_ranks_have(found, group).tolist()
        index = next((c for c, hit in zip(candidates, flags) if hit), None)
        if index is None:
            return None
        for _ in range(index):  # made by forwards whose recompute never came
            self._queue.popleft()
        out, lse, *_ = self._queue.popleft()
        return (out, lse) if flags[-1] else None

    def clear(self) -> None:
        self._queue.clear()

    def __len__(self) -> int:
        return len(self._queue)


def _all_ranks_have(found: torch.Tensor, group) -> torch.Tensor:
    """``found`` with its last entry replaced by its minimum over the group's ranks."""
    if not consensus.shared(group):
        return found
    found = found.clone()
    found[-1] = consensus.minimum(
        group, found[-1:], "for the other ranks to decide on a kept attention output",
        why="a rank failed or makes other attention calls than its peers")[0]
    return found
