"""A torch.profiler trace of a few micro-batches, the data path's background thread included.

``MEGATRON_BURST_TRACE=DIR`` (optionally ``DIR:FIRST:COUNT``, default ``DIR:4:3``) makes
every rank record micro-batches FIRST .. FIRST+COUNT-1 (counted where the document batches
are taken, from 0) and write ``DIR/rank<R>.json``, a Chrome trace (chrome://tracing,
Perfetto). All threads are recorded, so the prefetch thread's ranges ("megatron_burst: make
batch", "read sample") show beside the step's ops and kernels, and "megatron_burst: take
batch" shows what the step waited for its batch. Off (no profiler, nothing recorded) when
the variable is unset.
"""
from __future__ import annotations

import os
from typing import Optional

import torch

from megatron_burst.comm.settings import TRACE_ENV, current, parse_trace

ENV = TRACE_ENV


def _profiler() -> tuple[torch.profiler.profile, bool]:
    """(the profiler, whether it records every thread: torch releases without that option
    record only the thread that starts it, and the trace then lacks the prefetch thread)."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    try:
        config = torch.profiler._ExperimentalConfig(profile_all_threads=True)
    except TypeError:
        return torch.profiler.profile(activities=activities), False
    return torch.profiler.profile(activities=activities, experimental_config=config), True


class StepTrace:
    """Counts the micro-batches taken and profiles the chosen ones (``step`` at each take)."""

    def __init__(self, raw: Optional[str], rank: int,
                 config: Optional[tuple[str, int, int]] = None) -> None:
        self.config = parse_trace(raw) if raw else config
        self.rank = rank
        self.seen = 0
        self.prof: Optional[torch.profiler.profile] = None
        self.all_threads = False
        self.written: Optional[str] = None

    @staticmethod
    def from_env(rank: int) -> "StepTrace":
        return StepTrace(None, rank, current().trace)

    def step(self) -> None:
        """Called as each micro-batch is taken: starts the profiler before the first chosen
        one, stops it (after the GPU's queued work) and writes the trace after the last."""
        if self.config is None:
            return
        folder, first, count = self.config
        if self.seen == first:
            self.prof, self.all_threads = _profiler()
            self.prof.__enter__()
        elif self.seen == first + count and self.prof is not None:
            if torch.cuda.is_available():
                torch.cuda.synchronize()  # the chosen micro-batches' kernels, all recorded
            self.prof.__exit__(None, None, None)
            os.makedirs(folder, exist_ok=True)
            self.written = os.path.join(folder, f"rank{self.rank}.json")
            self.prof.export_chrome_trace(self.written)
            self.prof = None
            print(f"> trace of micro-batches {first}-{first + count - 1} written to "
                  f"{self.written}" + ("" if self.all_threads else " (this torch records the "
                                       "step's thread only: no prefetch thread in it)"),
                  flush=True)
        self.seen += 1
