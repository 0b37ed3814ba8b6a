"""What a document pack changes in the time model: the schedule the call will run.

A pack of documents, each causal on itself, sees far fewer (query, key) pairs than one causal
sequence of the same tokens; the kernel runs them at the rate of blocks as long as its
documents; a layout that keeps documents whole leaves a long one's work on one rank, and sends
a hop only the rows a later step needs (none, where every document is held whole). Predicted
as one causal sequence, documents came out at 0.53-0.66 of the prediction on 2x H200 (issue
41's ``auto_check``). So a pack is predicted from its own schedule (``scheduled_time``): the
placement its layout makes, each member's blocks at each step, the rows each hop carries.

'auto' decides a document call once per shape, from the first pack it sees
(``options.decide``): training's packs come from one mix, and a decision (and a timed check
of it) per pack cost a check every micro-batch (89 ms a new 8K pack on 2x H200).
"""
from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class PackLoad:
    """A document pack as the time model prices it: its layout, document lengths (all
    ranks'), and whether each document is causal. A key by value."""

    layout: str
    lens: tuple[int, ...]
    causal: bool = True

    @staticmethod
    def of_pack(lens: tuple[int, ...], layout: str, causal: bool = True) -> "PackLoad | None":
        """The pack of documents ``lens`` in ``layout`` (placed on the group of the topology
        it is priced for); None where it has no tokens (nothing to model)."""
        lens = tuple(int(n) for n in lens if n > 0)
        return PackLoad(layout, lens, bool(causal)) if lens else None

    def pairs(self) -> int:
        """Visible (query, key) pairs of the whole pack."""
        return sum(n * (n + 1) // 2 if self.causal else n * n for n in self.lens)

    def describe(self) -> str:
        return (f"{len(self.lens)} documents in {self.layout}, "
                f"{self.pairs() / sum(self.lens) ** 2:.3g} of tokens squared visible")
