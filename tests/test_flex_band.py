"""FlexAttention for large band blocks' forward (``kernels.flex``), on CPU.

The block mask's tiles are checked against the dense mask they summarise; the wrapper's
forward (FlexAttention's unfused form on CPU, float64) against the reference kernel on
fresh random bands, GQA and MQA included; and its rules: only large band blocks move, a
call signature that fails its check stays with the wrapped kernel, at most
``MAX_SIGNATURES`` signatures are compiled, and everything else is the wrapped kernel's.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from megatron_burst.kernels import flex
from megatron_burst.kernels.reference import ReferenceAttention, visible
from megatron_burst.plan.schedule import Block


@pytest.fixture(autouse=True)
def fresh_signatures(monkeypatch):
    """Each test starts with no signature met (the count is the process's)."""
    monkeypatch.setattr(flex, "_SIGNATURES", {})


pytestmark = [pytest.mark.skipif(not flex.available(), reason="torch without FlexAttention"),
              # on CPU FlexAttention runs unfused, as these small checks want
              pytest.mark.filterwarnings("ignore:flex_attention called without")]


def _random_band(gen: np.random.Generator) -> Block:
    """An n x m band in which every row and column sees a key (as the schedule makes them)."""
    n, m = (int(x) for x in gen.integers(1, 5 * flex.TILE, size=2))
    lo = int(gen.integers(-(n - 1), m))
    hi = int(gen.integers(max(lo, m - n), m))
    return Block(0, n, 0, m, "band", lo, hi)


@pytest.mark.parametrize("seed", range(6))
def test_band_tiles_summarise_the_dense_mask(seed):
    blk = _random_band(np.random.default_rng(seed))
    n, m = blk.q_stop, blk.k_stop
    dense = visible(blk, torch.device("cpu")).numpy()
    partial, full = flex.band_tiles(n, m, blk.lo, blk.hi)
    t = flex.TILE
    for a in range(partial.shape[0]):
        for b in range(partial.shape[1]):
            tile = dense[a * t:(a + 1) * t, b * t:(b + 1) * t]
            whole = tile.shape == (t, t)
            assert full[a, b] == (whole and tile.all()), (a, b)
            assert partial[a, b] == (tile.any() and not full[a, b]), (a, b)


def _qkv(n, m, hq, hkv, d, seed, batch=1):
    gen = torch.Generator().manual_seed(seed)
    make = lambda s, h: torch.randn(batch, s, h, d, generator=gen, dtype=torch.float64)  # noqa
    return make(n, hq), make(m, hkv), make(m, hkv)


@pytest.mark.parametrize("heads", [(4, 4), (4, 2), (4, 1)], ids=["MHA", "GQA", "MQA"])
@pytest.mark.parametrize("seed", range(3))
def test_flex_forward_equals_the_reference(heads, seed):
    blk = _random_band(np.random.default_rng(100 + seed))
    ref = ReferenceAttention()
    kernel = flex.FlexBandForward(ref, min_side=1, compiled=False)
    q, k, v = _qkv(blk.q_stop, blk.k_stop, *heads, 64, seed, batch=2)
    sig = flex._Signature(flex._attend, flex.band_mask(blk.q_stop, blk.k_stop, blk.lo, blk.hi,
                                                       q.device))
    got, want = kernel._run(sig, q, k, v, 0.125), ref.forward(q, k, v, blk, 0.125)
    assert not got[0].isnan().any()
    torch.testing.assert_close(got[0], want[0], rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(got[1].double(), want[1], rtol=1e-6, atol=1e-6)


class _Counting(ReferenceAttention):
    """The reference, counting its forwards; ``off`` makes its output differ."""

    def __init__(self, off=0.0):
        self.calls, self.off = 0, off

    def forward(self, q, k, v, block, scale):
        self.calls += 1
        out, lse = super().forward(q, k, v, block, scale)
        return out + self.off, lse


def test_only_large_band_blocks_move_and_each_shape_is_checked_once():
    inner = _Counting()
    kernel = flex.FlexBandForward(inner, min_side=200, compiled=False)
    band = Block(0, 256, 0, 300, "band", -100, 150)
    q, k, v = _qkv(256, 300, 4, 2, 64, 0)
    out, _ = kernel.forward(q, k, v, band, 0.1)
    assert inner.calls == 1  # the check against the wrapped kernel, once
    kernel.forward(q, k, v, band, 0.1)
    assert inner.calls == 1  # checked: FlexAttention alone
    torch.testing.assert_close(out, inner.forward(q, k, v, band, 0.1)[0])
    small = Block(0, 150, 0, 300, "band", -100, 150)
    kernel.forward(q[:, :150], k, v, small, 0.1)
    for kind in ("full", "causal"):
        kernel.forward(q, k[:, :256], v[:, :256], Block(0, 256, 0, 256, kind), 0.1)
    assert inner.calls == 2 + 3  # the small band and the dense kinds: the wrapped kernel


def test_a_shape_that_fails_its_check_stays_with_the_wrapped_kernel(caplog):
    inner = _Counting(off=1.0)  # "flash" now differs from FlexAttention
    kernel = flex.FlexBandForward(inner, min_side=1, compiled=False)
    band = Block(0, 130, 0, 140, "band", -20, 60)
    q, k, v = _qkv(130, 140, 2, 2, 64, 1)
    with caplog.at_level("WARNING"):
        out, _ = kernel.forward(q, k, v, band, 0.1)
    assert "differs" in caplog.text
    want = ReferenceAttention().forward(q, k, v, band, 0.1)[0] + 1.0
    torch.testing.assert_close(out, want)  # the wrapped kernel's answer, not FlexAttention's
    kernel.forward(q, k, v, band, 0.1)
    assert inner.calls == 3  # and it stays there


def test_at_most_max_signatures_go_to_flex(monkeypatch):
    inner = _Counting()
    kernel = flex.FlexBandForward(inner, min_side=1, compiled=False)
    runs = []
    real = flex.FlexBandForward._run
    monkeypatch.setattr(flex.FlexBandForward, "_run",
                        staticmethod(lambda *a: runs.append(a[1].shape) or real(*a)))
    extra = 3
    for n in range(130, 130 + flex.MAX_SIGNATURES + extra):
        q, k, v = _qkv(n, 140, 2, 1, 64, n)
        kernel.forward(q, k, v, Block(0, n, 0, 140, "band", -(n - 1), 139 - n + 1), 0.1)
    assert len(runs) == flex.MAX_SIGNATURES
    assert list(flex.signatures().values()) == [True] * flex.MAX_SIGNATURES
    assert inner.calls == flex.MAX_SIGNATURES + extra  # the checks, then the signatures past


def test_gradients_and_varlen_calls_are_the_wrapped_kernels():
    inner = ReferenceAttention()
    kernel = flex.FlexBandForward(inner, min_side=1, compiled=False)
    band = Block(0, 140, 0, 150, "band", -30, 40)
    q, k, v = _qkv(140, 150, 2, 2, 64, 2)
    out, lse = kernel.forward(q, k, v, band, 0.1)
    do = torch.randn_like(out)
    for got, want in zip(kernel.backward(do, q, k, v, out, lse, band, 0.1),
                         inner.backward(do, q, k, v, out, lse, band, 0.1)):
        torch.testing.assert_close(got, want)
    assert kernel.has_native(band) == hasattr(inner, "native")
