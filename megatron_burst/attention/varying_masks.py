"""Which calls' slice masks follow the data: there every block goes shape-free.

cuDNN builds an execution graph for every new block shape, and a mask that follows the data
(a new document pack, new prefix lengths, with every micro-batch) brings new block shapes
with every call. On 2x H200 (``benchmarks/results/h200x2_issue42_fresh/``) a new mask every
call ran at 6.8-11.1 TFLOP/s per GPU with its large blocks on cuDNN, and at 158-221 with
every block in varlen calls of the flash kernel, which builds nothing per shape. A mask that
stays the same call after call (a fixed window or prefix, one pack reused) keeps cuDNN for
its large blocks: once its graphs exist it is faster there (428 against 221 TFLOP/s for
full attention per document, same run).

So, per call shape (everything a call's plan depends on but the mask), the first mask seen
plans as before; once a second, different mask arrives for that shape, masks there follow
the data, and every mask planned for it from then on is shape-free (``PlanKey``'s
``dense_min_area`` None, as for document packs): its large full and causal blocks carved
into cores of few shapes on cuDNN (``plan.blocks.carved``, ``thresholds.SHAPE_FREE_GRAIN``),
the rest on the flash kernel. The price of so simple a rule: a process that calls several
fixed masks on one call shape (a benchmark of mask families) runs all but the first
shape-free, up to about 2x slower on large blocks than with graphs of their own shapes
(less where carved), never the 20-30x of cuDNN graphs built per call; a mask planned before
a shape turned keeps its plan. This only changes which local kernel runs a block, never
what is sent: ranks that disagreed here would still exchange the same messages (and their
calls' masks are checked to agree anyway). Bounded, keyed by value.
"""
from __future__ import annotations

import collections
import threading
from typing import Hashable

from ..plan.slices import SliceMask

HISTORY = 256  # call shapes remembered (the oldest dropped)

# call shape -> the first mask seen there, or None once a different one came
_FIRST: "collections.OrderedDict[Hashable, SliceMask | None]" = collections.OrderedDict()
_LOCK = threading.Lock()


def follows_data(shape: Hashable, mask: SliceMask) -> bool:
    """Record ``mask`` for calls of ``shape``; whether masks there change from call to call
    (this one is not the first mask the shape saw)."""
    with _LOCK:
        if shape not in _FIRST:
            _FIRST[shape] = mask
            if len(_FIRST) > HISTORY:
                _FIRST.popitem(last=False)
            return False
        _FIRST.move_to_end(shape)
        first = _FIRST[shape]
        if first is not None and first == mask:
            return False
        _FIRST[shape] = None
        return True


def clear() -> None:
    """Forget every call shape (tests)."""
    with _LOCK:
        _FIRST.clear()
