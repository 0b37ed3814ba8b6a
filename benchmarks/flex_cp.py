"""PyTorch's own context parallelism for FlexAttention, as a peer of ``slice_masks.py``.

LongCA-bench and issue 42 put PyTorch's FlexAttention CP beside a mask's distributed call:
it takes any block mask, and all-gathers K/V for every call. This is PyTorch's code path,
not a copy: ``torch.distributed.tensor.experimental``'s ``_ContextParallel`` style
(FLEX) on a module that calls ``flex_attention``, whose forward hook all-gathers K and V
over the mesh; the inputs and the block mask sharded by ``_context_parallel_shard`` with
its mask-aware load balancer (``_PTRRLoadBalancer``: blocks dealt round-robin by their
processing time). The block mask is read from one dense [N, N] bool buffer, as the one-GPU
``Flex`` of ``slice_masks`` reads it (``dense_mask``), so both run the same mask.

PyTorch requires the sequence to be a multiple of world x 128 (its block size); these are
private APIs of PyTorch, so a version that moved them raises here, named.
"""
from __future__ import annotations

import torch

SEQ_DIM = 2  # flex_attention's [b, h, s, d]


def dense_mask(mask, allowed: torch.Tensor) -> torch.Tensor:
    """``allowed`` (a [N, N] bool buffer) set to the pairs ``mask`` (a ``SliceMask``) shows:
    within a slice of qlen x klen, ``causal`` sees j <= i + klen - qlen, ``inv_causal``
    j >= i, ``bi_causal`` both, ``full`` all."""
    allowed.zero_()
    dev = allowed.device
    for (qs, qe), (ks, ke), kind in zip(mask.q_ranges, mask.k_ranges, mask.kinds):
        i = torch.arange(qe - qs, device=dev)[:, None]
        j = torch.arange(ke - ks, device=dev)[None, :]
        show = torch.ones(qe - qs, ke - ks, dtype=torch.bool, device=dev)
        if kind in ("causal", "bi_causal"):
            show &= j <= i + (ke - ks) - (qe - qs)
        if kind in ("inv_causal", "bi_causal"):
            show &= j >= i
        allowed[qs:qe, ks:ke] |= show
    return allowed


class _Attend(torch.nn.Module):
    """The module PyTorch's CP style wraps: its forward hook gathers K and V."""

    def __init__(self, attend) -> None:
        super().__init__()
        self.attend = attend

    def forward(self, query, key, value, **kwargs):
        return self.attend(query, key, value, **kwargs)


class FlexCP:
    """PyTorch's FlexAttention context parallelism over the default group, one mask at a
    time: ``shard(mask, full)`` places q, k, v, dO ([1, N, h, d], whole) and the mask on
    this rank; calling it runs one forward on what ``shard`` placed."""

    def __init__(self, total: int, world: int, dev: torch.device, compile: bool = True):
        try:
            from torch.distributed.device_mesh import init_device_mesh
            from torch.distributed.tensor.experimental._attention import (
                _context_parallel_shard, _ContextParallel)
            from torch.distributed.tensor.experimental._context_parallel._load_balancer import (
                _PTRRLoadBalancer)
            from torch.distributed.tensor.parallel import parallelize_module
            from torch.nn.attention.flex_attention import create_block_mask, flex_attention
        except ImportError as err:
            raise RuntimeError(f"FlexCP: this PyTorch ({torch.__version__}) lacks its "
                               f"FlexAttention CP API: {err}") from err
        if total % (world * 128):
            raise ValueError(f"FlexCP: PyTorch's FlexAttention CP needs the sequence ({total}) "
                             f"to be a multiple of world x 128 ({world * 128})")
        self.mesh = init_device_mesh(dev.type, (world,))
        self.allowed = torch.zeros(total, total, dtype=torch.bool, device=dev)
        allowed = self.allowed
        self.mask_mod = lambda b, h, q, k: allowed[q, k]
        self.total, self.world, self.dev = total, world, dev
        self._create, self._shard, self._balancer = (create_block_mask, _context_parallel_shard,
                                                     _PTRRLoadBalancer)
        attend = torch.compile(flex_attention, dynamic=False) if compile else flex_attention
        self.module = parallelize_module(_Attend(attend), self.mesh, _ContextParallel(
            seq_dim=SEQ_DIM, attention_type=_ContextParallel.AttentionType.FLEX))
        self.block = self.balancer = None

    def shard(self, mask, full: list[torch.Tensor]) -> list[torch.Tensor]:
        """This rank's q, k, v, dO ([1, h, s, d], q, k, v requiring grad) for ``mask``, placed
        by PyTorch's load balancer, and the block mask for its queries against all keys."""
        dense_mask(mask, self.allowed)
        block = self._create(self.mask_mod, 1, 1, self.total, self.total, device=self.dev)
        bhsd = [t.transpose(1, 2).contiguous() for t in full]
        self.balancer = self._balancer(block, self.world)
        *local, self.block = self._shard(self.mesh, [*bhsd, block], [SEQ_DIM] * (len(bhsd) + 1),
                                         load_balancer=self.balancer)
        return [t.requires_grad_() if i < 3 else t for i, t in enumerate(local)]

    def __call__(self, q, k, v):
        return self.module(q, k, v, block_mask=self.block, enable_gqa=True)

    def unshard(self, out: torch.Tensor) -> torch.Tensor:
        """The whole sequence's output ([1, h, N, d]) from every rank's (a collective)."""
        from torch.distributed.tensor.experimental._attention import context_parallel_unshard

        return context_parallel_unshard(self.mesh, [out], [SEQ_DIM],
                                        load_balancer=self.balancer)[0]
