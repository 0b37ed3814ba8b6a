"""The host operators inside labelled spans of a ``torch.profiler`` run, per call.

Three tools read operators off a profile (``trace_methods`` from an exported trace,
``host_kinds --ops`` and ``auto_gap`` from a live profiler). Each counts only what ran
inside a call's own span (``torch.profiler.record_function``), on the span's thread: a
profile of a whole loop also holds its harness (the staging of inputs, the GPU syncs
between calls), and ``host_kinds --ops`` once reported a harness sync's 2.7 ms as the
call's biggest growth from the tiny call to 8K (``results/h100x2_issue41_real_packs``).
"""
from __future__ import annotations

import collections
from typing import Callable, Iterable

import torch

# (name, thread, start us, duration us): an operator or a span, whatever the profile's form
Event = tuple[str, int, float, float]


def ops_in_spans(spans: Iterable[Event], ops: Iterable[Event]) -> collections.Counter:
    """Each operator's total microseconds over those of ``ops`` that start inside one of
    ``spans`` on the span's thread."""
    by_thread: dict[int, list[tuple[float, float]]] = collections.defaultdict(list)
    for _, tid, start, dur in spans:
        by_thread[tid].append((start, start + dur))
    totals: collections.Counter = collections.Counter()
    for name, tid, start, dur in ops:
        if any(a <= start < z for a, z in by_thread.get(tid, ())):
            totals[name] += dur
    return totals


SPAN = "call:"  # the label of a call's span


def profiled_calls(run: Callable[[], object], calls: int,
                   between: Callable[[], object] = lambda: None, self_time: bool = False,
                   spans_inside: bool = False) -> dict[str, float]:
    """Each host operator's milliseconds a call (its own time with ``self_time``, else with
    what it calls) over ``calls`` runs of ``run`` under ``torch.profiler``, ``between()``
    before each, outside the calls' spans (staging, syncs). ``spans_inside``: ``run`` opens
    its call's span itself (``record_function(SPAN)``), around the part that is the call."""
    from torch.profiler import ProfilerActivity, profile, record_function

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(calls):
            between()
            if spans_inside:
                run()
            else:
                with record_function(SPAN):
                    run()
        between()
    events = list(prof.events())
    spans = [(e.name, e.thread, e.time_range.start, e.time_range.elapsed_us())
             for e in events if e.name == SPAN]
    ops = [(e.name, e.thread, e.time_range.start,
            e.self_cpu_time_total if self_time else e.time_range.elapsed_us())
           for e in events if e.name != SPAN]
    return {name: us / 1e3 / calls for name, us in ops_in_spans(spans, ops).items()}


def synced(device: torch.device) -> Callable[[], None]:
    """A ``between`` that waits for ``device`` (nothing on CPU)."""
    return (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
