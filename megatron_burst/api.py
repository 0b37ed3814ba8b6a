"""``burst_attn``: the public entry point.

A call is prepared once per shape (``prepare``: checks, topology, signature, plans), its
arguments are compared across the group (``agree``), its ring messages are tagged with its
number, signature and label (``comm.headers``), and the ring runs (``burst``), inside the
Ulysses all-to-alls when the topology has them.
"""
from __future__ import annotations

import dataclasses

import torch
import torch.distributed as dist

from . import agree, prepare
from .burst import BurstAttentionFunction
from .comm import headers
from .cp_topology import CPTopology
from .packs import DocumentPack
from .sharding import group_size_rank
from .remat import AttentionKeep
from .ulysses import heads_to_sequence, sequence_to_heads


def burst_attn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               group: dist.ProcessGroup | None = None, *, causal: bool = False,
               softmax_scale: float | None = None, window_size: tuple[int, int] = (-1, -1),
               layout: str = "zigzag", backward: str = "auto", qkv_format: str = "bshd",
               intra_node_size: int | str | None = None, ulysses_size: int | str = 1,
               cu_seqlens: torch.Tensor | DocumentPack | None = None, return_lse: bool = False,
               kernel: str | None = None, keep: AttentionKeep | None = None,
               call_label: int | str | None = None, topology: CPTopology | None = None):
    """Exact attention over a sequence sharded across ``group`` (BurstAttention).

    q: [b, s_local, hq, d]; k, v: [b, s_local, hkv, d] (``qkv_format="sbhd"`` swaps the
    first two dims). Returns out (q's shape, dtype and layout), and with
    ``return_lse=True`` also lse [b, hq, s_local] fp32. Differentiable in q, k and v.
    ``kernel`` forces a local attention backend by name (see ``kernels.KERNELS``).
    ``cu_seqlens`` may be a ``DocumentPack`` (``pack_documents``), made once per batch: its
    plans are then made once for all the layers that attend over the pack.
    ``ulysses_size``, ``intra_node_size`` and ``backward`` may be ``"auto"``: the time
    model (``timing``, with the profile ``$MEGATRON_BURST_PROFILE`` or the shipped default)
    picks the fastest for this shape; ranks per node come from torchrun's LOCAL_WORLD_SIZE.
    ``keep`` (``remat.AttentionKeep``): under full recompute, a call without autograd keeps
    its output there and the recompute (with autograd) takes it instead of running the ring.
    ``topology``: a ``CPTopology`` already decided (``options.resolve``, e.g. once per run by
    the Megatron entry point), used as it is instead of ``backward``, ``intra_node_size`` and
    ``ulysses_size``.
    ``call_label`` (e.g. the layer number) goes into every ring message's header with the
    call's number and signature (``headers``): a rank whose call pairs with a peer's call of
    another label raises instead of computing with the wrong messages.
    """
    headers.poll()  # an earlier pass that received another call's message raises here
    agree.require_member(group)  # first: a non-member's group size reads -1
    world, _ = group_size_rank(group)
    # One list, so the key and the preparation can never read the arguments differently.
    options = (causal, softmax_scale, window_size, layout, backward, qkv_format,
               intra_node_size, ulysses_size, cu_seqlens, kernel, keep, call_label, topology)
    try:
        key = prepare.call_key(group, q, k, v, *options)
        call = prepare.PREPARED.get(key) if key is not None else None
        if call is None:
            call = prepare.prepare(q, k, v, group, world, *options)
            if key is not None:
                prepare.remember(key, call)
    except Exception as err:  # whatever failed, the peers learn of it instead of waiting
        said = str(err) if isinstance(err, ValueError) else f"{type(err).__name__}: {err}"
        agree.check_agreement(group, agree.failed_signature(said))
        raise
    agree.check_agreement(group, call.sig)
    spec = call.spec
    if world > 1 and not prepare.capturing(q):
        # Numbered after the check, so a call every rank refused counts nowhere. A CUDA
        # graph replays its messages as captured: no header to write or check there.
        spec = dataclasses.replace(spec, tag=headers.CallTag(_next_call(group), call.digest,
                                                             call.label))
    # Every rank of the group makes the same keep/take decision: same program, same order.
    kept = keep.take(call.keep_key) if keep is not None and torch.is_grad_enabled() else None
    if call.ulysses_peers is None:
        # NCCL and gloo send contiguous buffers; Megatron hands K/V as views of fused QKV.
        out, lse = _ring(q.contiguous(), k.contiguous(), v.contiguous(), spec, keep, kept,
                         call.keep_key)
    else:
        out, lse = _ulysses_burst(q, k, v, spec, group, call.ulysses_peers,
                                  qkv_format == "sbhd", keep, kept, call.keep_key)
    return (out, lse) if return_lse else out


_CALLS: dict[str, int] = {}  # calls made on each group (the same on all its ranks)


def _next_call(group) -> int:
    name = (group if group is not None else dist.group.WORLD).group_name
    _CALLS[name] = _CALLS.get(name, 0) + 1
    return _CALLS[name]


def _ring(q, k, v, spec, keep, kept, key):
    """The ring (or its kept output), keeping the output for a recompute when asked."""
    if kept is not None:
        keep.check(kept, q)
    out, lse = BurstAttentionFunction.apply(q, k, v, spec, kept)
    if keep is not None and not torch.is_grad_enabled():
        keep.put(out, lse, key)
    return out, lse


def _ulysses_burst(q, k, v, spec, group, peers, seq_first, keep, kept, key):
    """Heads -> sequence inside each Ulysses group (``peers``), the ring across groups, and
    back."""
    u = len(peers)
    if k.shape[2] < u:  # too few K/V heads to split: replicate each to U/hkv slots
        k = k.repeat_interleave(u // k.shape[2], dim=2)
        v = v.repeat_interleave(u // v.shape[2], dim=2)
    as_bshd = (lambda t: t.transpose(0, 1)) if seq_first else (lambda t: t)
    qs, ks, vs = (heads_to_sequence(as_bshd(t), peers, group, 1, 2) for t in (q, k, v))
    out, lse = _ring(qs, ks, vs, spec, keep, kept, key)
    out = sequence_to_heads(out, peers, group, 1, 2)
    lse = sequence_to_heads(lse, peers, group, 2, 1)
    return (out.transpose(0, 1).contiguous() if seq_first else out), lse


