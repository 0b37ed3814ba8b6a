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

A sliding window and a slice mask change the work the same way, so a call with one is
priced from its schedule too (``of_mask``): priced as the plain causal or full sequence it
is not, a window family's call came out 3.4x its measured time on 2x H100 (the first-use
check then timed the runner-up). Their blocks run on the dense kernel, as a plain sequence's.
"""
from __future__ import annotations

import dataclasses

from ..plan.blocks import Mask
from ..plan.slices import SliceMask, band_area


@dataclasses.dataclass(frozen=True)
class PackLoad:
    """A call's work as the time model prices it: its layout, its sequences' lengths (all
    ranks'), whether each is causal, and ``mask``: a window (``Mask``) or a ``SliceMask``
    where the call has one. ``documents``: the lengths are a pack's documents (the varlen
    kernel's rates) rather than one sequence under a mask (the dense kernel's, ``batch``
    sequences of it). A key by value."""

    layout: str
    lens: tuple[int, ...]
    causal: bool = True
    mask: Mask | SliceMask | None = None
    documents: bool = True
    batch: int = 1

    @staticmethod
    def of_pack(lens: tuple[int, ...], layout: str, causal: bool = True,
                window: tuple[int, int] = (-1, -1)) -> "PackLoad | None":
        """The pack of documents ``lens`` in ``layout`` (placed on the group of the topology
        it is priced for), each under ``window``; None where it has no tokens (nothing to
        model)."""
        lens = tuple(int(n) for n in lens if n > 0)
        mask = None if tuple(window) == (-1, -1) else Mask(bool(causal), tuple(window))
        return PackLoad(layout, lens, bool(causal), mask) if lens else None

    @staticmethod
    def of_mask(mask: Mask | SliceMask, layout: str, total: int,
                batch: int = 1) -> "PackLoad | None":
        """``batch`` sequences of ``total`` tokens (all ranks') under ``mask`` in
        ``layout``; None where there are no tokens."""
        causal = mask.causal if isinstance(mask, Mask) else False
        return (PackLoad(layout, (int(total),), causal, mask, documents=False,
                         batch=int(batch)) if total > 0 and batch > 0 else None)

    @property
    def plain(self) -> bool | None:
        """Whether the load is one plain sequence's, causal (True) or full (False): a mask
        of one causal or full slice over the whole sequence, or no window; None if not. Such
        a call is priced as the plain call it is (``timing.predict``), the same either way
        it is asked for."""
        if self.documents:
            return None
        if isinstance(self.mask, SliceMask):
            n = self.lens[0]
            whole = self.mask.q_ranges == ((0, n),) == self.mask.k_ranges
            return self.mask.kinds[0] == "causal" if whole and self.mask.kinds[0] in (
                "causal", "full") else None
        return self.causal if self.mask is None or self.mask.plain else None

    @property
    def schedule_mask(self) -> Mask | SliceMask:
        """The mask the call's schedule is made with."""
        return self.mask if self.mask is not None else Mask(self.causal, (-1, -1))

    def pairs(self) -> int:
        """Visible (query, key) pairs of one sequence (a pack's: all its documents)."""
        if isinstance(self.mask, SliceMask):
            return self.mask.area
        if self.mask is not None and not self.mask.plain:
            left, right = self.mask.window
            return sum(int(band_area(n, n, -(n - 1) if left < 0 else -left,
                                     0 if self.causal else (n - 1 if right < 0 else right)))
                       for n in self.lens)
        return sum(n * (n + 1) // 2 if self.causal else n * n for n in self.lens)

    def describe(self) -> str:
        seen = f"{self.pairs() / sum(self.lens) ** 2:.3g} of tokens squared visible"
        if self.documents:
            window = "" if self.mask is None else f" under window {self.mask.window}"
            return f"{len(self.lens)} documents in {self.layout}{window}, {seen}"
        what = (self.mask.described if isinstance(self.mask, SliceMask)
                else f"window {self.mask.window}")
        return f"{what} in {self.layout}, {seen}"
