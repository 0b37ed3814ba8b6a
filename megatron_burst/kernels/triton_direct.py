"""A compiled Triton kernel launched through its own launcher, past Triton's per-call binding.

Why: ``kernel[grid](*args)`` binds, specialises and hashes every argument in Python at each
call. For the fused merge (``merge.py``: 18 arguments, now 21) a probe measured 29 us of
host a launch on one 2x H100 host and 97 on a slower one, against 9 through the compiled
kernel's own launcher (NOTES, nineteenth session; ``benchmarks/merge_launch.py`` times both
ways). An eager forward launches the merge a few times a call, and on a slow host the host
is what the GPUs wait for.

Exact by construction: a key's launcher is the compiled kernel that Triton's own launch
returned for arguments of that key, and the caller's key holds everything Triton
specialises that kernel on (dtypes, constants, the alignment of the pointers it specialises,
32-bit integers). Before a launcher is adopted it runs once beside Triton's launch on
scratch arguments of the same key (the caller's ``check``), and only a bitwise match adopts
it; otherwise (another Triton's launcher API, a launch that raises) the key keeps Triton's
launch. Nothing is learnt while a CUDA graph is captured: the check synchronises.
"""
from __future__ import annotations

from typing import Any, Callable, Hashable

import torch


class DirectLaunches:
    """Launches of one Triton ``kernel`` whose constexpr parameters come last, in order.

    ``check(key, compiled)``: whether ``compiled`` (what Triton's launch returned, None
    under Triton's interpreter) launched directly gives Triton's results for ``key``."""

    def __init__(self, kernel: Any, check: Callable[[Hashable, Any], bool]):
        self.kernel, self.check = kernel, check
        self._compiled: dict[Hashable, Any] = {}  # key -> compiled kernel, None: Triton's

    def launch(self, key: Hashable | None, grid: tuple[int, int, int], args: tuple,
               constants: dict, num_warps: int) -> None:
        """``kernel[grid](*args, **constants, num_warps=num_warps)``; ``key`` None: a
        launch the caller cannot key (it always goes through Triton's binding)."""
        compiled = self._compiled.get(key) if key is not None else None
        if compiled is not None:
            compiled[grid](*args, *constants.values())
            return
        done = self.kernel[grid](*args, **constants, num_warps=num_warps)
        if key is not None and key not in self._compiled and not _capturing():
            self._compiled[key] = done if _checked(self.check, key, done) else None

    def adopted(self, key: Hashable) -> bool:
        """Whether ``key`` launches directly (tests, benchmarks)."""
        return self._compiled.get(key) is not None


def _capturing() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def _checked(check: Callable[[Hashable, Any], bool], key: Hashable, compiled: Any) -> bool:
    if compiled is None or not hasattr(compiled, "__getitem__"):
        return False
    try:
        return bool(check(key, compiled))
    except Exception:  # noqa: BLE001 - any failure keeps Triton's own launch for the key
        return False
