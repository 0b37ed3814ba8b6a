"""``benchmarks/flex_cp.py``: PyTorch's FlexAttention CP, as ``slice_masks.py`` runs it beside
burst_attn, computes the mask it is given (forward, float64, 2 gloo ranks, against a dense
reference; FlexAttention has no backward on CPU), and refuses a sequence PyTorch cannot
shard, by name."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from .distributed import run_ranks

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
flex_cp = pytest.importorskip("flex_cp")


def _dense(full, allowed, groups: int) -> torch.Tensor:
    q, k, v = (t.transpose(1, 2) for t in full[:3])
    k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    s = (q @ k.transpose(-1, -2)) / q.shape[-1] ** 0.5
    return torch.nan_to_num(torch.softmax(s.masked_fill(~allowed, float("-inf")), -1)) @ v


def _families(rank, world, names):
    from megatron_burst.plan import mask_families as mf

    total = 256 * world
    gen = torch.Generator().manual_seed(7)
    full = [torch.randn(1, total, h, 16, generator=gen, dtype=torch.float64) for h in (4, 2, 2)]
    cp = flex_cp.FlexCP(total, world, torch.device("cpu"), compile=False)
    errors = {}
    for name in names:
        mask = mf.family(name, [300, 100, 112], window=64, global_size=64, prefix=128)
        q, k, v, _ = (t.detach() for t in cp.shard(mask, full + [full[0]]))
        got = cp.unshard(cp(q, k, v))
        ref = _dense(full, flex_cp.dense_mask(mask, torch.zeros(total, total, dtype=torch.bool)),
                     groups=2)
        errors[name] = float((got - ref).norm() / ref.norm())
    return errors


def test_pytorch_flex_cp_computes_the_mask_it_is_given():
    names = ("causal", "sliding_window", "shared_question", "global_sliding_window")
    for errors in run_ranks(2, _families, names, timeout=300):
        assert set(errors) == set(names)
        assert all(e < 1e-12 for e in errors.values()), errors


def test_a_sequence_pytorch_cannot_shard_is_refused_by_name():
    with pytest.raises(ValueError, match="multiple of world x 128"):
        flex_cp.FlexCP(300, 2, torch.device("cpu"), compile=False)
