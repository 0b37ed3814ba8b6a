"""Bounded waits: a peer that fails or hangs mid-ring must not leave the others waiting.

On CPU (gloo) every host-blocking wait gives up after ``MEGATRON_BURST_TIMEOUT_S`` seconds
(default 600; ``settings``) with an error naming the peer (``wait_bounded``). On CUDA the host never
blocks here; the process group's own timeout ends a dead peer's transfers.
"""
from __future__ import annotations

import datetime
import time
from typing import Callable

import torch
import torch.distributed as dist

from .settings import TIMEOUT_ENV, current  # noqa: F401  (TIMEOUT_ENV: named here too)


def timeout_s() -> float:
    """The bound on one host-blocking wait, in seconds (``settings``: read once, checked
    there; a value that is not a finite number of seconds in (0, 1e9] raises ValueError
    naming the variable, before any wait)."""
    return current().timeout_s


def wait_bounded(work: dist.Work, device: torch.device, waiting_for: "str | Callable",
                 args: tuple = (), why: str = "that rank failed or is stuck") -> None:
    """Wait for ``work``; on CPU give up after ``timeout_s()`` with an error naming the peer.

    ``waiting_for`` completes "rank R waited T s ..." (e.g. "for a ring hop from rank 0
    (forward)"); a function, it makes those words from ``args``, only if they are needed.
    On CUDA (NCCL) nothing is bounded here, because ``wait()`` only makes the
    current stream wait and the host never blocks: a dead peer is caught by the process
    group's own timeout (``init_process_group(timeout=...)``), whose watchdog aborts the
    communicator when ``TORCH_NCCL_ASYNC_ERROR_HANDLING`` is on (the default).
    """
    if device.type != "cpu":
        work.wait()
        return
    start = time.monotonic()
    try:
        work.wait(timeout=datetime.timedelta(seconds=current().timeout_s))
    except RuntimeError as e:  # gloo's timeout, or the peer's connection closing
        words = waiting_for(*args) if callable(waiting_for) else waiting_for
        raise RuntimeError(f"rank {dist.get_rank()} waited {time.monotonic() - start:.1f} s "
                           f"{words}: {why}") from e
