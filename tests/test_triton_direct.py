"""``kernels.triton_direct``: when a Triton kernel is launched past Triton's binding, on CPU
with a stand-in kernel (the GPU test, ``tests/test_gpu_merge_launch.py``, runs the fused
merge itself). Adopted only after its check passes, once per key; never for a key the
caller cannot give, a failed or raising check, Triton's interpreter (no compiled kernel
returned), or while a CUDA graph is captured; the direct launch gets every argument and the
constants in order."""
from __future__ import annotations

import pytest
import torch

from megatron_burst.kernels import triton_direct
from megatron_burst.kernels.triton_direct import DirectLaunches


class _Compiled:
    def __init__(self, log):
        self.log = log

    def __getitem__(self, grid):
        return lambda *args: self.log.append(("direct", grid, args))


class _Kernel:
    """Triton's ``kernel[grid](*args, **constants, num_warps=)``, returning ``compiled``."""

    def __init__(self, compiled=True):
        self.log = []
        self.compiled = _Compiled(self.log) if compiled else None

    def __getitem__(self, grid):
        def launch(*args, num_warps, **constants):
            self.log.append(("triton", grid, args, constants, num_warps))
            return self.compiled
        return launch


def _launch(launches, key, n=3):
    for i in range(n):
        launches.launch(key, (i + 1, 2, 1), ("x", i), {"D": 64, "ROWS": 32}, 4)


def test_adopted_after_its_check_once_then_direct_with_the_constants_in_order():
    kernel, checked = _Kernel(), []
    launches = DirectLaunches(kernel, lambda key, c: checked.append((key, c)) or True)
    _launch(launches, "k")
    assert [key for key, _ in checked] == ["k"] and callable(checked[0][1])
    assert kernel.log == [("triton", (1, 2, 1), ("x", 0), {"D": 64, "ROWS": 32}, 4),
                          ("direct", (2, 2, 1), ("x", 1, 64, 32)),
                          ("direct", (3, 2, 1), ("x", 2, 64, 32))]
    assert launches.adopted("k") and not launches.adopted("other")


class _Run:
    """A compiled kernel of Triton 3.x: its launcher ``run`` and the handles it takes."""

    def __init__(self, log):
        self.log, self.function, self.packed_metadata = log, "fn", "meta"
        self.run = lambda *a: log.append(("run", a))

    def __getitem__(self, grid):
        return lambda *args: self.log.append(("runner", grid, args))


def test_the_direct_launch_calls_run_with_the_current_stream_and_no_hooks(monkeypatch):
    """Past the runner: ``run`` gets the grid, the current stream, the handles fetched once,
    no metadata or hooks, then every argument and constant; with a launch hook set in
    Triton, the runner (which builds the metadata the hook reads) launches instead."""
    knobs = pytest.importorskip("triton").knobs
    kernel = _Kernel()
    kernel.compiled = _Run(kernel.log)
    monkeypatch.setattr(triton_direct, "_current_stream", lambda: 77)
    launches = DirectLaunches(kernel, lambda key, launcher: True)
    _launch(launches, "k", n=2)
    assert kernel.log[1:] == [("run", (2, 2, 1, 77, "fn", "meta", None, None, None,
                                       "x", 1, 64, 32))]
    hook = lambda metadata: None  # noqa: E731
    if hasattr(knobs.runtime.launch_enter_hook, "add"):
        knobs.runtime.launch_enter_hook.add(hook)
        undo = lambda: knobs.runtime.launch_enter_hook.remove(hook)  # noqa: E731
    else:
        monkeypatch.setattr(knobs.runtime, "launch_enter_hook", hook)
        undo = lambda: None  # noqa: E731
    try:
        launches.launch("k", (5, 2, 1), ("x", 9), {"D": 64, "ROWS": 32}, 4)
    finally:
        undo()
    assert kernel.log[-1] == ("runner", (5, 2, 1), ("x", 9, 64, 32))


@pytest.mark.parametrize("check", [lambda key, c: False, lambda key, c: 1 / 0],
                         ids=["fails", "raises"])
def test_a_check_that_fails_or_raises_keeps_tritons_launch_and_is_not_asked_again(check):
    kernel, asked = _Kernel(), []
    launches = DirectLaunches(kernel, lambda key, c: asked.append(key) or check(key, c))
    _launch(launches, "k")
    assert asked == ["k"] and not launches.adopted("k")
    assert [entry[0] for entry in kernel.log] == ["triton"] * 3


def test_a_compiled_kernel_that_cannot_be_prepared_keeps_tritons_launch():
    """Loading its handles raises (a module that does not load): no check, no adoption, and
    the forward goes on through Triton's launch."""
    class Broken(_Compiled):
        def __getitem__(self, grid):
            raise RuntimeError("module failed to load")

    kernel = _Kernel()
    kernel.compiled = Broken(kernel.log)
    launches = DirectLaunches(kernel, lambda k, c: pytest.fail("nothing to check"))
    _launch(launches, "k")
    assert not launches.adopted("k") and [e[0] for e in kernel.log] == ["triton"] * 3


def test_no_key_or_no_compiled_kernel_always_goes_through_triton():
    for key, kernel in ((None, _Kernel()), ("k", _Kernel(compiled=False))):
        launches = DirectLaunches(kernel, lambda k, c: pytest.fail("nothing to check"))
        _launch(launches, key)
        assert [entry[0] for entry in kernel.log] == ["triton"] * 3


def test_nothing_is_learnt_while_a_graph_is_captured(monkeypatch):
    kernel = _Kernel()
    launches = DirectLaunches(kernel, lambda key, c: True)
    monkeypatch.setattr(triton_direct, "_capturing", lambda: True)
    _launch(launches, "k", n=2)
    assert not launches.adopted("k")
    monkeypatch.setattr(triton_direct, "_capturing", lambda: False)
    _launch(launches, "k", n=2)
    assert [entry[0] for entry in kernel.log] == ["triton"] * 3 + ["direct"]


def test_the_merge_keys_no_cpu_launch():
    """Off CUDA (Triton's interpreter in CI) the merge gives no key: Triton's launch."""
    from megatron_burst.kernels import merge

    out, blk = torch.zeros(1, 4, 2, 16), torch.zeros(1, 4, 2, 16)
    lse, blse = torch.zeros(1, 2, 4), torch.zeros(1, 2, 4)
    assert merge._direct_key(out, lse, blk, blse, (4, 2), 16, 32, 4, False) is None


def test_tritons_own_launch_is_swapped_in_and_back_or_refused_without_triton(monkeypatch):
    """``merge.tritons_own_launch``: inside, a launcher that adopts nothing; after, the
    package's own again (also when the body raises); without Triton it says so."""
    from megatron_burst.kernels import merge

    if merge.triton is None:
        with pytest.raises(RuntimeError, match="Triton is not installed"):
            with merge.tritons_own_launch():
                pass
        return
    own = merge._LAUNCHES
    with pytest.raises(KeyError):
        with merge.tritons_own_launch():
            assert merge._LAUNCHES is not own and not merge._LAUNCHES.adopted(("any",))
            raise KeyError("body")
    assert merge._LAUNCHES is own
