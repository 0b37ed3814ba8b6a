"""Peer context-parallel attention methods, for the benchmark only.

- ``ulysses_attention``: DeepSpeed-Ulysses (written here): all-to-all heads <-> sequence,
  one local attention over the whole sequence with 1/G of the heads, all-to-all back.
- ``allgather_kv_attention``: Llama-3-style CP (written here): all-gather K/V, local
  attention of this rank's queries against every key, reduce-scatter dK/dV.
- ``native_cp``: PyTorch's own ``context_parallel`` (torch.distributed.tensor.experimental)
  with ring rotation; not written here, only driven.
- For packed documents, with PyTorch's varlen flash kernel (``varlen_attention``):
  ``allgather_varlen`` (torchtitan's varlen CP: all-gather K/V, one varlen call per rank)
  and ``ulysses_varlen`` (all-to-all heads, one varlen call over every document).

The first two call the same local kernel as megatron_burst (``kernels.select_kernel``), so
the comparison is about communication and scheduling, not about kernels.
"""
from __future__ import annotations

import contextlib
import functools

import torch
import torch.distributed as dist
import torch.nn.functional as F

from megatron_burst import kernels
from megatron_burst.kernels.merge import merge_partial
from megatron_burst.plan.placement import chunks_of, rank_segments
from megatron_burst.plan.schedule import Block


class _LocalBlocks(torch.autograd.Function):
    """Attention of q rows against k rows as a list of blocks, merged; differentiable."""

    @staticmethod
    def forward(ctx, q, k, v, blocks, scale):
        kern = kernels.select_kernel(q, k)
        b, s, h, d = q.shape
        out = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
        lse = torch.full((b, h, s), float("-inf"), device=q.device)
        for blk in blocks:
            o, o_lse = kern.forward(q[:, blk.q], k[:, blk.k], v[:, blk.k], blk, scale)
            merge_partial(out[:, blk.q], lse[:, :, blk.q], o, o_lse)
        out = out.to(q.dtype)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.blocks, ctx.scale, ctx.kern = blocks, scale, kern
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        dout = dout.contiguous()
        dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
        dk = torch.zeros(k.shape, dtype=torch.float32, device=q.device)
        dv = torch.zeros(v.shape, dtype=torch.float32, device=q.device)
        for blk in ctx.blocks:
            gq, gk, gv = ctx.kern.backward(dout[:, blk.q], q[:, blk.q], k[:, blk.k],
                                           v[:, blk.k], out[:, blk.q], lse[:, :, blk.q], blk,
                                           ctx.scale)
            dq[:, blk.q] += gq
            dk[:, blk.k] += gk
            dv[:, blk.k] += gv
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None


def local_attention(q, k, v, blocks, scale=None):
    return _LocalBlocks.apply(q, k, v, tuple(blocks), scale or q.shape[-1] ** -0.5)


def _natural_order(world: int, chunk: int, device) -> torch.Tensor:
    """Index that puts the concatenation of every rank's zigzag shard in position order."""
    pos = torch.cat([torch.arange(c * chunk, (c + 1) * chunk)
                     for r in range(world) for c in chunks_of("zigzag", world, r)])
    return torch.argsort(pos).to(device)


def _all_to_all(x: torch.Tensor) -> torch.Tensor:
    x = x.contiguous()
    out = torch.empty_like(x)
    dist.all_to_all_single(out, x)
    return out


class _AllToAll(torch.autograd.Function):
    """Piece i of dim 0 to rank i; the backward is the same exchange (it is its own inverse)."""

    @staticmethod
    def forward(ctx, x):
        return _all_to_all(x)

    @staticmethod
    def backward(ctx, g):
        return _all_to_all(g)


def ulysses_attention(q, k, v, causal: bool):
    """q/k/v: this rank's zigzag shard [b, s, h, d]; heads must divide by the group size."""
    world = dist.get_world_size()
    b, s, hq, d = q.shape
    order = _natural_order(world, s // 2, q.device)

    def to_seq(t):  # [b, s, h, d] -> [b, world*s, h/world, d] in position order
        h = t.shape[2]
        x = t.reshape(b, s, world, h // world, d).permute(2, 0, 1, 3, 4)  # [w, b, s, h/w, d]
        x = _AllToAll.apply(x).permute(1, 0, 2, 3, 4).reshape(b, world * s, h // world, d)
        return x.index_select(1, order)

    qs, ks, vs = (to_seq(t) for t in (q, k, v))
    n = qs.shape[1]
    out = local_attention(qs, ks, vs, [Block(0, n, 0, n, "causal" if causal else "full")])
    inv = torch.argsort(order)
    out = out.index_select(1, inv).reshape(b, world, s, hq // world, d).permute(1, 0, 2, 3, 4)
    out = _AllToAll.apply(out).permute(1, 2, 0, 3, 4).reshape(b, s, hq, d)
    return out


class _GatherSeq(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        world = dist.get_world_size()
        out = torch.empty((world * x.shape[0],) + x.shape[1:], dtype=x.dtype, device=x.device)
        dist.all_gather_into_tensor(out, x.contiguous())
        return out.view((world,) + x.shape)

    @staticmethod
    def backward(ctx, g):
        mine = torch.empty(g.shape[1:], dtype=g.dtype, device=g.device)
        dist.reduce_scatter_tensor(mine, g.reshape((-1,) + g.shape[2:]).contiguous())
        return mine


def allgather_kv_attention(q, k, v, causal: bool):
    """Llama-3 CP: gather every rank's K/V, attend locally, reduce-scatter dK/dV."""
    world, rank = dist.get_world_size(), dist.get_rank()
    b, s, _, d = q.shape
    c = s // 2
    order = _natural_order(world, c, q.device)

    def gather(t):
        g = _GatherSeq.apply(t)  # [world, b, s, h, d]
        return g.permute(1, 0, 2, 3, 4).reshape(b, world * s, t.shape[2], d).index_select(
            1, order)

    kf, vf = gather(k), gather(v)
    blocks = []
    for i, chunk in enumerate(chunks_of("zigzag", world, rank)):
        rows = (i * c, (i + 1) * c)
        if causal:
            if chunk:
                blocks.append(Block(*rows, 0, chunk * c, "full"))
            blocks.append(Block(*rows, chunk * c, (chunk + 1) * c, "causal"))
        else:
            blocks.append(Block(*rows, 0, 2 * world * c, "full"))
    return local_attention(q, kf, vf, blocks)


@contextlib.contextmanager
def native_cp(world: int, buffers: list[torch.Tensor], causal: bool):
    """PyTorch's context_parallel over the whole group, ring ('alltoall') rotation.

    The buffers ([b, h, s, d] full-length, identical on every rank) are sharded in place
    with PyTorch's own load balancing; SDPA calls inside the block run as ring attention.
    """
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.experimental import _attention, context_parallel

    mesh = init_device_mesh("cuda", (world,))
    _attention.set_rotate_method("alltoall")
    # Its head-tail load balancer refuses non-causal masks ("Load balancing requires
    # causal"); a full mask is balanced anyway, so switch it off there.
    _attention._cp_options.enable_load_balance = causal
    with context_parallel(mesh, buffers=buffers, buffer_seq_dims=[2] * len(buffers),
                          no_restore_buffers=set(buffers)):
        yield


def native_sdpa(q, k, v, causal: bool):
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal)


# ---------------------------------------------------------------------------- documents


def varlen_attention(q, k, v, cu, cu_k=None, causal: bool = True):
    """PyTorch's varlen flash attention (differentiable) on [1, t, h, d] tensors."""
    from torch.nn.attention.varlen import varlen_attn

    cu_k = cu if cu_k is None else cu_k
    lens_q, lens_k = cu[1:] - cu[:-1], cu_k[1:] - cu_k[:-1]
    hq, hkv = q.shape[2], k.shape[2]
    if hq != hkv:  # varlen_attn takes GQA with enable_gqa where it has it; else expand
        try:
            out = varlen_attn(q[0], k[0], v[0], cu, cu_k, int(lens_q.max()), int(lens_k.max()),
                              window_size=(-1, 0) if causal else (-1, -1), enable_gqa=True)
            return out[None]
        except TypeError:
            k, v = (t.repeat_interleave(hq // hkv, dim=2) for t in (k, v))
    out = varlen_attn(q[0], k[0], v[0], cu, cu_k, int(lens_q.max()), int(lens_k.max()),
                      window_size=(-1, 0) if causal else (-1, -1))
    return out[None]


def _doc_starts(cu: torch.Tensor) -> list[int]:
    return cu.tolist()[:-1]


def natural_order(layout: str, world: int, cu: torch.Tensor, device) -> torch.Tensor:
    """Index that puts the concatenation of every rank's shard in position order."""
    return _natural_order_cached(layout, world, tuple(cu.tolist()), str(device))


@functools.lru_cache(maxsize=8)  # built once per document mix, not inside the timed loop
def _natural_order_cached(layout, world, bounds, device) -> torch.Tensor:
    lens = tuple(b - a for a, b in zip(bounds, bounds[1:]))
    pos = [bounds[s.doc] + s.pos + i for r in range(world)
           for s in rank_segments(layout, world, r, lens) for i in range(s.length)]
    return torch.argsort(torch.tensor(pos)).to(device)


def allgather_varlen(q, k, v, cu, layout: str):
    """torchtitan's varlen CP: gather every rank's K/V into position order, then one varlen
    call of this rank's query segments against their documents' keys (causal, aligned at
    the bottom right: a segment at position p of its document sees keys 0..p+i)."""
    world, rank = dist.get_world_size(), dist.get_rank()
    b, s, _, d = q.shape
    order = natural_order(layout, world, cu, q.device)
    lens = tuple((cu[1:] - cu[:-1]).tolist())
    starts = _doc_starts(cu)

    def gather(t):
        g = _GatherSeq.apply(t)  # [world, b, s, h, d]
        return g.permute(1, 0, 2, 3, 4).reshape(b, world * s, t.shape[2], d).index_select(
            1, order)

    kf, vf = gather(k), gather(v)
    segs = rank_segments(layout, world, rank, lens)
    spans = [(starts[g.doc], starts[g.doc] + g.pos + g.length) for g in segs]
    kp, vp = (torch.cat([t[:, a:e] for a, e in spans], dim=1) for t in (kf, vf))
    cu_q = torch.tensor([0, *torch.tensor([g.length for g in segs]).cumsum(0).tolist()],
                        dtype=torch.int32, device=q.device)
    cu_k = torch.tensor([0, *torch.tensor([e - a for a, e in spans]).cumsum(0).tolist()],
                        dtype=torch.int32, device=q.device)
    return varlen_attention(q, kp, vp, cu_q, cu_k)


def ulysses_varlen(q, k, v, cu, layout: str):
    """Ulysses for documents: all-to-all heads <-> sequence, one varlen call over every
    document with 1/G of the heads, all-to-all back."""
    world = dist.get_world_size()
    b, s, hq, d = q.shape
    order = natural_order(layout, world, cu, q.device)

    def to_seq(t):  # [b, s, h, d] -> [b, world*s, h/world, d] in position order
        h = t.shape[2]
        x = t.reshape(b, s, world, h // world, d).permute(2, 0, 1, 3, 4)
        x = _AllToAll.apply(x).permute(1, 0, 2, 3, 4).reshape(b, world * s, h // world, d)
        return x.index_select(1, order)

    out = varlen_attention(*(to_seq(t) for t in (q, k, v)), cu.to(q.device))
    out = out.index_select(1, torch.argsort(order)).reshape(b, world, s, hq // world, d)
    out = _AllToAll.apply(out.permute(1, 0, 2, 3, 4)).permute(1, 2, 0, 3, 4)
    return out.reshape(b, s, hq, d)
