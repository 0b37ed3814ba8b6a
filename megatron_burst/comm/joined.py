"""A message's piece made of several tensors: views of a larger tensor, joined along one dim
only inside the message (``messages.Packed.holding``), or inside the output it is a part of
(a ``Joined`` of ``Joined`` parts: Ulysses' own piece on the way back).

Apart from ``messages`` because it is a value the callers make (Ulysses' way back, whose
pieces are runs of rows of one output), not part of posting.
"""
from __future__ import annotations

import dataclasses

import torch


@dataclasses.dataclass(frozen=True)
class Joined:
    """Tensors that a message carries as one, joined along ``dim`` (views of a larger one,
    say): each is copied into its place in the message, not first into a joined tensor
    that the message then copies again."""

    parts: "tuple[torch.Tensor | Joined, ...]"
    dim: int

    @property
    def shape(self) -> torch.Size:
        first = self.parts[0].shape
        size = sum(p.shape[self.dim] for p in self.parts)
        return torch.Size((*first[:self.dim], size, *first[self.dim + 1:]))

    @property
    def dtype(self) -> torch.dtype:
        return self.parts[0].dtype

    @property
    def device(self) -> torch.device:
        return self.parts[0].device

    def write(self, out: torch.Tensor) -> None:
        """Each part into its place in ``out`` (of ``shape``); a part that is itself
        ``Joined`` (along any dim) part by part."""
        at = 0
        for part in self.parts:
            view = out.narrow(self.dim, at, part.shape[self.dim])
            if isinstance(part, Joined):
                part.write(view)
            else:
                view.copy_(part)
            at += part.shape[self.dim]

    def joined(self) -> torch.Tensor:
        """The parts as one tensor (a copy, unless there is one plain part)."""
        if len(self.parts) == 1 and not isinstance(self.parts[0], Joined):
            return self.parts[0]
        if not any(isinstance(part, Joined) for part in self.parts):
            return torch.cat(self.parts, self.dim)
        out = torch.empty(self.shape, dtype=self.dtype, device=self.device)
        self.write(out)
        return out
