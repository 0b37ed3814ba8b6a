"""A kept attention output goes to its own recompute only, whatever the inputs (issue 40,
item 8): the fingerprint hashes the inputs' bytes under coefficients drawn per kept output.

The first case is an input built against a fingerprint of FIXED projections (two per row,
as before): it differs from the kept one by 166% of its norm, only in directions those
projections cannot see; a fixed scheme hands it the wrong output (gradients ~7x off).
"""
from __future__ import annotations

import math

import pytest
import torch
import torch.utils.checkpoint as ckpt

import megatron_burst as mb
from megatron_burst.attention import remat
from megatron_burst.attention.remat import AttentionKeep, fingerprint

from .reference import reference_attention

S, HQ, HKV, D = 64, 4, 2, 16


def _fixed_projections(d: int) -> torch.Tensor:
    """[d, 2]: the two per-row projections a fixed fingerprint used (golden-ratio cosines)."""
    idx = torch.arange(d, dtype=torch.float64)
    return torch.stack([torch.cos(idx * (math.sqrt(5) - 1) * math.pi + phase)
                        for phase in (0.3, 1.7)], 1)


def _blind_twin(x: torch.Tensor, size: float, seed: int) -> torch.Tensor:
    """x plus a change of ``size`` times its norm that every row's fixed projections miss."""
    w = _fixed_projections(x.shape[-1])
    basis, _ = torch.linalg.qr(w)  # an orthonormal basis of what the projections see
    noise = torch.randn(x.shape, generator=torch.Generator().manual_seed(seed),
                        dtype=torch.float64)
    noise = noise - noise @ basis @ basis.T  # invisible to them
    assert (noise @ w).abs().max() < 1e-9
    return x + noise * (size * x.norm() / noise.norm())


def _inputs(seed: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(1, S, h, D, generator=gen, dtype=torch.float64) for h in (HQ, HKV, HKV)]


def test_an_input_invisible_to_fixed_projections_gets_its_own_attention():
    kept_inputs = _inputs(1)
    twin = [_blind_twin(t, 1.66, 10 + i) for i, t in enumerate(kept_inputs)]
    keep = AttentionKeep()
    with torch.no_grad():  # kept, and no recompute of these inputs will come
        mb.burst_attn(*kept_inputs, causal=True, keep=keep)

    def attend(q, k, v):
        return mb.burst_attn(q, k, v, causal=True, keep=keep)

    leaves = [t.clone().requires_grad_() for t in twin]
    ckpt.checkpoint(attend, *leaves, use_reentrant=True).square().sum().backward()
    ref = [t.clone().requires_grad_() for t in twin]
    out, _ = reference_attention(*ref, causal=True, scale=D ** -0.5)
    out.square().sum().backward()
    for got, want in zip(leaves, ref):
        assert (got.grad - want.grad).norm() / want.grad.norm() < 1e-10


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float64])
def test_any_changed_bit_changes_the_hash_and_equal_bytes_never_do(dtype):
    """Equal bytes hash alike under a seed (through any view: fused QKV slices); flipping any
    one bit of any element changes the hash, for fresh seeds each time."""
    gen = torch.Generator().manual_seed(5)
    fused = torch.randn(2, 24, 3, 4, 3 * 8, generator=gen).to(dtype)  # [b, s, h..., 3d]
    k = fused[..., 8:16]  # a strided view, as Megatron hands K
    for trial in range(40):
        seed = remat.new_seed()
        assert torch.equal(fingerprint((k,), seed), fingerprint((k.contiguous(),), seed))
        flipped = k.contiguous().clone()
        raw = flipped.view(torch.int8).view(-1)
        pos = int(torch.randint(raw.numel(), (1,), generator=gen))
        raw[pos] ^= 1 << int(torch.randint(8, (1,), generator=gen))
        assert not torch.equal(fingerprint((k,), seed), fingerprint((flipped,), seed)), trial


def test_the_int8_product_and_the_float64_one_are_the_same_integers():
    gen = torch.Generator().manual_seed(6)
    x = torch.randint(-128, 128, (40, 64), generator=gen, dtype=torch.int8)
    c = torch.randint(-128, 128, (64, remat.PROJECTIONS), generator=gen, dtype=torch.int8)
    assert torch.equal(remat._row_sums(x, c), x.long() @ c.long())
    assert torch.equal(remat._row_sums(x[:8], c), x[:8].long() @ c.long())  # float64 path


def test_the_stated_bound_is_the_arithmetic():
    """(1/256 + 1/P)^8: what remat's docstring and the README promise."""
    assert (1 / 256 + 1 / remat.P) ** remat.PROJECTIONS < 6e-20
    assert "6e-20" in remat.__doc__
    from .readme import says

    says("collide with probability below 6e-20 per check")
