"""The host's part of the time model: what a call costs the CPU until it returns, and how
that overlaps the GPU's time.

Apart from ``timing`` because the host is measured and modelled on its own terms: a plain
call's fixed cost (timed at first use on calls of the call's shape, ``measure.HostShape``,
Ulysses' apart), and a new document pack's, which the host plans at every call, growing
with its documents.
"""
from __future__ import annotations

import math
from typing import Protocol

from .topology import CPTopology


class HostFigures(Protocol):
    """What this module reads of a profile (``timing.Profile``), in microseconds."""

    call_overhead_us: float
    step_overhead_us: float
    ulysses_call_overhead_us: float | None
    pack_call_overhead_us: float | None
    pack_doc_overhead_us: float | None
    ulysses_pack_call_overhead_us: float | None
    ulysses_pack_doc_overhead_us: float | None

# Where a profile has no pack figures (shipped ones, older caches): a document pack's call
# costs the host this many times a plain call's tiny-call figure. Fitted by hand with
# ``overlapped`` on the 2x H100 runs on file (``results/h100x2_issue41_host``, ``_queued``,
# ``_new_packs``), where a pack's own host time ran 1.0-1.7x the tiny call from one machine
# session to the next, so first use now times packs itself (``pack_seconds``).
PACK_HOST = 1.7


def host_seconds(topology: CPTopology, prof: HostFigures, steps: int,
                 docs: int | None = None) -> float:
    """The host's seconds for one call of ``steps`` ring steps (forward and backward): its
    fixed cost (Ulysses' where the topology splits heads and the profile measured it) and a
    cost per step; for a new pack of ``docs`` documents, ``pack_seconds`` (timed on whole
    calls, its ring steps included), else ``PACK_HOST`` times the plain call's."""
    if docs is not None:
        measured = pack_seconds(topology, prof, docs)
        if measured is not None:
            return measured
    per_call = prof.call_overhead_us
    if topology.ulysses > 1 and prof.ulysses_call_overhead_us is not None:
        per_call = prof.ulysses_call_overhead_us
    host = (per_call + steps * prof.step_overhead_us) * 1e-6
    return host if docs is None else host * PACK_HOST


def pack_seconds(topology: CPTopology, prof: HostFigures, docs: int) -> float | None:
    """A new pack's call of ``docs`` documents, from the profile's measured pack figures
    (Ulysses' where the topology splits heads); None where it has none."""
    ulysses = topology.ulysses > 1
    fixed = prof.ulysses_pack_call_overhead_us if ulysses else prof.pack_call_overhead_us
    per_doc = prof.ulysses_pack_doc_overhead_us if ulysses else prof.pack_doc_overhead_us
    if fixed is None or per_doc is None:
        return None
    return (fixed + docs * per_doc) * 1e-6


def overlapped(gpu_s: float, host_s: float) -> float:
    """A call's seconds from its GPU's and its host's: the host launches ahead of the GPU,
    but not always far enough (a hop or an all-to-all is posted only when the host gets
    there; an idle GPU waits for the first launch), so the call takes more than the larger
    of the two and less than their sum: their root sum of squares, an empirical law. With
    each row's own measured host time in place of the model's, 153 of 160 rows of two runs
    come within 15%, where the model of the day had 125 (``benchmarks/model_replay.py
    --row-host``, ``results/h100x2_issue41_host/replay_row_host.md``)."""
    return math.hypot(gpu_s, host_s)
