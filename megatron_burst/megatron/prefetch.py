"""Make each batch before the step that takes it, on a background thread.

``Prefetcher(source, make, group)`` iterates over ``make(sample)`` for the samples of
``source``. One background thread reads the source and makes the batches, ``depth``
(default 2) micro-batches ahead of the step's thread, which takes them in order: while
step i runs, batch i+2 is made, and batch i+1's outcome is agreed over ``group``.

- Exact: a batch is made from one sample and handed out with it, as one value, in the
  source's order; nothing is looked up by position or identity. ``make`` must be host work
  (it runs beside the step: no collective, no CUDA stream; pinning memory is fine).
- Errors: a failed read or make is kept with its batch and raised when the step takes that
  batch, on every rank of ``group`` (``batch_verdict``), and so is the source's end. The
  outcomes are gathered when the batch before is taken, so on NCCL no step waits for it.
- The thread: a daemon thread per prefetcher, on the step's CUDA device (pinned memory
  then comes from that device's context, as in the DataLoader's pin-memory thread).
  ``close`` cancels what has not started and joins it; a prefetcher dropped unclosed ends
  its thread after the job in hand; ``close_all`` (also at exit) joins every one.

``prefetching`` puts one under Megatron's ``RerunDataIterator`` (what megatron.training
hands ``forward_step``), so the rerun machinery saves and replays made batches; other
iterators are left as they are (their batches are made on the step).
"""
from __future__ import annotations

import atexit
import collections
import dataclasses
import itertools
import queue
import threading
import weakref
from concurrent.futures import Future
from typing import Any, Callable, Iterator, Optional

import torch
from torch.profiler import record_function

from megatron_burst.comm.consensus import shared
from megatron_burst.comm.settings import PREFETCH_ENV, current
from megatron_burst.megatron.batch_verdict import EXHAUSTED, FAILED, OK, Verdict, settle

THREAD_PREFIX = "megatron-burst-prefetch"
ENV = PREFETCH_ENV  # 1 (default): make batches ahead; 0: on the step


def enabled() -> bool:
    """Whether the data path makes batches ahead ($MEGATRON_BURST_PREFETCH, the same on
    every rank: the outcome gathers are collectives; ``comm.settings``, read once)."""
    return current().prefetch


@dataclasses.dataclass(frozen=True)
class Outcome:
    """A made batch, or why there is none (the source's StopIteration, or an exception)."""

    value: Any = None
    error: Optional[BaseException] = None

    @property
    def code(self) -> int:
        if self.error is None:
            return OK
        return EXHAUSTED if isinstance(self.error, StopIteration) else FAILED


@dataclasses.dataclass
class _Slot:
    future: Future
    submitted_in: int  # the take (1, 2, ...) during which it was submitted
    verdict: Optional[Verdict] = None


class Prefetcher:
    """An iterator over ``make(sample)`` for the samples of ``source``, made ahead (see the
    module docstring). Take from it on every rank of ``group``, in step."""

    def __init__(self, source: Iterator, make: Callable[[Any], Any], group: Any = None,
                 depth: int = 2) -> None:
        if depth < 1:
            raise ValueError(f"Prefetcher depth must be at least 1, got {depth}")
        self.source = source
        self._make, self._group, self._depth = make, group, depth
        self._pending: "collections.deque[_Slot]" = collections.deque()
        self._takes = 0
        self._source_ended = False  # read and written by the background thread only
        self._worker = _Worker(_step_device())
        # Dropped without close (its RerunDataIterator went away): the thread ends anyway.
        self._release = weakref.finalize(self, self._worker.stop, False)
        self.closed = False
        _OPEN.add(self)

    def __iter__(self) -> "Prefetcher":
        return self

    def __getattr__(self, name: str) -> Any:
        # Code that reaches through RerunDataIterator.iterable to the loader still finds it.
        if name == "source":
            raise AttributeError(name)
        return getattr(self.source, name)

    def save_state(self) -> Any:
        """Refused: the loader has been read ``depth`` batches past the step, so its state
        would resume after batches no step took (Megatron's --dataloader-save)."""
        raise RuntimeError("the data loader's state cannot be saved while document batches are "
                           "made ahead (it has been read past the step): set "
                           "MEGATRON_BURST_PREFETCH=0 with --dataloader-save")

    def __next__(self) -> Any:
        if self.closed:
            raise ValueError("this Prefetcher was closed")
        with record_function("megatron_burst: take batch"):
            self._takes += 1
            self._fill()
            slot = self._pending.popleft()
            outcome = slot.future.result()
            if not shared(self._group):
                self._fill()
                if outcome.error is not None:
                    raise outcome.error
                return outcome.value
            codes = (slot.verdict or Verdict(self._group, outcome.code)).codes()
            self._agree_ahead()
            self._fill()
            settle(codes, outcome.error, self._group)
            return outcome.value

    def _agree_ahead(self) -> None:
        """Gather the next batch's outcome now, if its making started before this take (so
        it has had a step to finish): it is read at the next take, by then home."""
        if self._pending:
            head = self._pending[0]
            if head.verdict is None and head.submitted_in < self._takes:
                head.verdict = Verdict(self._group, head.future.result().code)

    def _fill(self) -> None:
        # Always `depth` slots, on every rank alike (after the source's end the jobs return
        # at once): the collectives above depend only on these counts.
        while len(self._pending) < self._depth:
            self._pending.append(_Slot(self._worker.submit(self._job), self._takes))

    def _job(self) -> Outcome:
        """Read one sample and make its batch (on the background thread)."""
        if self._source_ended:
            return Outcome(error=StopIteration())
        try:
            with record_function("megatron_burst: read sample"):
                sample = next(self.source)
        except StopIteration:
            self._source_ended = True
            return Outcome(error=StopIteration())
        except BaseException as err:  # noqa: BLE001 (kept for the step that takes it)
            return Outcome(error=err)
        try:
            with record_function("megatron_burst: make batch"):
                return Outcome(value=self._make(sample))
        except BaseException as err:  # noqa: BLE001
            return Outcome(error=err)

    def close(self, timeout: Optional[float] = None) -> None:
        """Cancel the batches not yet started, wait (up to ``timeout`` s; None: as long as it
        takes) for the one being made, end the thread."""
        if self.closed:
            return
        self.closed = True
        for slot in self._pending:
            slot.future.cancel()
        self._pending.clear()
        self._release.detach()
        self._worker.stop(True, timeout)
        _OPEN.discard(self)


def _step_device() -> Optional[int]:
    """The step's CUDA device, if CUDA is up: the thread makes it its own, so that pinning
    memory there uses that device's context instead of creating one on GPU 0 (as the
    DataLoader's pin-memory thread does)."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return torch.cuda.current_device()
    return None


class _Worker:
    """One daemon thread running submitted jobs in order (a job cancelled before it starts
    is skipped); ``stop`` ends it after the job in hand."""

    def __init__(self, device: Optional[int]) -> None:
        self.device = device
        self._queue: "queue.SimpleQueue" = queue.SimpleQueue()
        _WORKERS.difference_update([w for w in _WORKERS if not w.thread.is_alive()])
        self.thread = threading.Thread(target=self._run, daemon=True,
                                       name=f"{THREAD_PREFIX}-{next(_NUMBERS)}")
        _WORKERS.add(self)
        self.thread.start()

    def submit(self, job: Callable[[], Any]) -> Future:
        future: Future = Future()
        self._queue.put((future, job))
        return future

    def _run(self) -> None:
        if self.device is not None:
            torch.cuda.set_device(self.device)  # this thread's current device only
        while True:
            item = self._queue.get()
            if item is None:
                return
            future, job = item
            del item
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(job())
                except BaseException as err:  # noqa: BLE001 (jobs keep theirs; never lost)
                    future.set_exception(err)
            del future, job  # hold nothing of the prefetcher between jobs

    def stop(self, wait: bool, timeout: Optional[float] = None) -> None:
        self._queue.put(None)
        if wait and self.thread is not threading.current_thread():
            self.thread.join(timeout)
            if not self.thread.is_alive():
                _WORKERS.discard(self)


_OPEN: "weakref.WeakSet[Prefetcher]" = weakref.WeakSet()
_WORKERS: "set[_Worker]" = set()  # started and not yet joined (finished ones pruned)
_NUMBERS = itertools.count()


def close_all(timeout: Optional[float] = None) -> None:
    """Close every open Prefetcher and end every prefetch thread, those of prefetchers already
    dropped included (for callers that end a run early, and at exit)."""
    for prefetcher in list(_OPEN):
        prefetcher.close(timeout)
    for worker in list(_WORKERS):
        worker.stop(True, timeout)


# At exit a job may still wait on a source that is shutting down (a DataLoader's workers):
# the daemon thread is given a few seconds, never the power to hold the exit.
atexit.register(close_all, 10.0)


def prefetching(data_iterator: Any, make: Callable[[Any], Any], group: Any) -> Any:
    """The iterator to take batches from: a ``Prefetcher`` as it is; a Megatron
    ``RerunDataIterator`` with a Prefetcher under it (once), so its replays hand back made
    batches; anything else as it is (its samples are made on the step)."""
    if isinstance(data_iterator, Prefetcher):
        return data_iterator
    try:
        from megatron.core.rerun_state_machine import RerunDataIterator
    except ImportError:
        return data_iterator
    if isinstance(data_iterator, RerunDataIterator):
        if not isinstance(data_iterator.iterable, Prefetcher):
            data_iterator.iterable = Prefetcher(data_iterator.iterable, make, group)
    return data_iterator
