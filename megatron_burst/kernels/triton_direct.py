"""A compiled Triton kernel launched through its own launcher, past Triton's per-call binding.

Why: ``kernel[grid](*args)`` binds, specialises and hashes every argument in Python at each
call. For the fused merge (``merge.py``: 18 arguments, now 21) a probe measured 29 us of
host a launch on one 2x H100 host and 97 on a slower one, against 9 through the compiled
kernel's own launcher (NOTES, nineteenth session; ``benchmarks/merge_launch.py`` times both
ways). An eager forward launches the merge a few times a call, and on a slow host the host
is what the GPUs wait for. The compiled kernel's ``kernel[grid]`` runner still costs a
closure, a lookup of the current device through ``torch.cuda`` and Triton's launch metadata
at each call (py-spy with native frames, twenty-second session: more than a quarter of a merge
launch's host); ``_direct`` calls its ``run`` with the handles fetched once, the current
stream read by one C call, and no metadata where no launch hook is set.

Exact by construction: a key's launcher is the compiled kernel that Triton's own launch
returned for arguments of that key, and the caller's key holds everything Triton
specialises that kernel on (dtypes, constants, the alignment of the pointers it specialises,
32-bit integers). Before a launcher is adopted it runs once beside Triton's launch on
scratch arguments of the same key (the caller's ``check``), and only a bitwise match adopts
it; otherwise (another Triton's launcher API, a launch that raises) the key keeps Triton's
launch. Nothing is learnt while a CUDA graph is captured: the check synchronises. A launch
hook set in Triton (a profiler's) sends every launch through the runner, which calls it.
"""
from __future__ import annotations

from typing import Any, Callable, Hashable

import torch

Launcher = Callable[..., None]  # launcher(grid, *args, *constants)


class DirectLaunches:
    """Launches of one Triton ``kernel`` whose constexpr parameters come last, in order.

    ``check(key, launcher)``: whether ``launcher(grid, *args, *constants)`` (the compiled
    kernel Triton's launch returned, launched directly) gives Triton's results for ``key``."""

    def __init__(self, kernel: Any, check: Callable[[Hashable, Launcher], bool]):
        self.kernel, self.check = kernel, check
        self._launchers: dict[Hashable, Launcher | None] = {}  # None: Triton's launch

    def launch(self, key: Hashable | None, grid: tuple[int, int, int], args: tuple,
               constants: dict, num_warps: int) -> None:
        """``kernel[grid](*args, **constants, num_warps=num_warps)``; ``key`` None: a
        launch the caller cannot key (it always goes through Triton's binding)."""
        launcher = self._launchers.get(key) if key is not None else None
        if launcher is not None:
            launcher(grid, *args, *constants.values())
            return
        done = self.kernel[grid](*args, **constants, num_warps=num_warps)
        if key is not None and key not in self._launchers and not _capturing():
            launcher = _direct(done)
            self._launchers[key] = launcher if _checked(self.check, key, launcher) else None

    def adopted(self, key: Hashable) -> bool:
        """Whether ``key`` launches directly (tests, benchmarks)."""
        return self._launchers.get(key) is not None


def _direct(compiled: Any) -> Launcher | None:
    """``compiled``'s launch without its runner's per-call lookups, or its runner where this
    Triton's compiled kernel lacks the parts (``run``, ``function``, ``packed_metadata``:
    Triton 3.x); None where nothing was compiled (Triton's interpreter) or its module does
    not load (then the key keeps Triton's own launch, as a failed check does)."""
    if compiled is None or not hasattr(compiled, "__getitem__"):
        return None
    try:
        from triton import knobs
        compiled[(1, 1, 1)]  # loads the module once: ``function`` and its metadata
        run, function, meta = compiled.run, compiled.function, compiled.packed_metadata
        hooks = knobs.runtime
    except (ImportError, AttributeError):
        return lambda grid, *args: compiled[grid](*args)
    except Exception:  # noqa: BLE001 - a launch that cannot be prepared is never adopted
        return None

    def launch(grid: tuple[int, int, int], *args: Any) -> None:
        if _hooked(hooks.launch_enter_hook) or _hooked(hooks.launch_exit_hook):
            compiled[grid](*args)  # the runner builds the metadata the hook reads
            return
        run(grid[0], grid[1], grid[2], _current_stream(), function, meta, None, None, None,
            *args)
    return launch


def _current_stream() -> int:
    """The current device's current CUDA stream, as Triton's runner reads it (a capture's
    stream while a graph is captured), by two C calls rather than through ``torch.cuda``."""
    return torch._C._cuda_getCurrentRawStream(torch._C._cuda_getDevice())


def _hooked(hook: Any) -> bool:
    """Whether a launch hook is set: Triton 3.4+ keeps a chain of them (``calls``)."""
    return hook is not None and bool(getattr(hook, "calls", True))


def _capturing() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def _checked(check: Callable[[Hashable, Launcher], bool], key: Hashable,
             launcher: Launcher | None) -> bool:
    if launcher is None:
        return False
    try:
        return bool(check(key, launcher))
    except Exception:  # noqa: BLE001 - any failure keeps Triton's own launch for the key
        return False
