"""One small ``burst_attn`` call, the unit of the tests of ranks that disagree or pair up
wrongly: random inputs seeded by the rank, the defaults those tests start from."""
from __future__ import annotations

import itertools

import torch
import torch.distributed as dist

import megatron_burst as mb


def call(rank: int = 0, *, s: int = 8, hq: int = 6, hkv: int = 3, d: int = 8,
         dtype: torch.dtype = torch.float32, grad: bool = False,
         docs: tuple[int, ...] | None = None, group: dist.ProcessGroup | None = None,
         **kwargs) -> torch.Tensor:
    """burst_attn on small random bshd/sbhd inputs; ``kwargs`` override its defaults."""
    gen = torch.Generator().manual_seed(rank)
    shape = (s, 1) if kwargs.get("qkv_format") == "sbhd" else (1, s)
    q, k, v = (torch.randn(*shape, h, d, generator=gen).to(dtype).requires_grad_(grad)
               for h in (hq, hkv, hkv))
    cu = None if docs is None else torch.tensor([0, *itertools.accumulate(docs)])
    options = dict(causal=True, layout="zigzag", backward="burst", cu_seqlens=cu)
    options.update(kwargs)
    return mb.burst_attn(q, k, v, group, **options)
