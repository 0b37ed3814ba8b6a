"""A burst_attn call prepared once: arguments checked, topology resolved, signed and planned.

Every check here uses only this rank's arguments and the group's size, so a bad call
raises ``ValueError`` on every rank before any byte is sent, instead of leaving the ranks
that passed waiting forever on the ones that failed. Arguments that are fine on each rank
but differ between ranks are caught next, by ``agree.check_agreement`` (in ``api``).

What a call's tensors' values do not change (validation, topology, signature, the ring's
schedule and kernel-call plans) is made once per shape and document pack (``prepare``)
and looked up after (``call_key``), so a repeated call costs the host a dictionary lookup.
"""
from __future__ import annotations

import collections
import dataclasses
import math
import os

import torch
import torch.distributed as dist

from . import agree
from .ring_spec import RingSpec
from .comm import headers
from .comm.topology import RingTopology
from .cp_topology import CPTopology, HeadShape
from .options import BurstOptions, check_decided, cp_ranks_per_node, local_gpus, resolve
from .kernels.selection import KERNEL_NAMES, default_scale
from .packs import DocumentPack, pack_documents
from .sharding import group_ranks
from .placement import LAYOUTS, chunks_per_rank, local_length
from .remat import AttentionKeep
from .schedule import Mask, RingSchedule

QKV_FORMATS = ("bshd", "sbhd")


def _validate(q, k, v, world, causal, softmax_scale, window_size, layout, qkv_format,
              cu_seqlens, kernel) -> DocumentPack | None:
    """Raise ValueError for any bad argument; return the pack of documents, if any.

    The ring's shape (Ulysses size, ranks per node, backward mode) is checked by
    ``options.resolve`` and ``CPTopology.build``.
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{name} must be 4-D [{qkv_format[0]}, {qkv_format[1]}, heads, "
                             f"head_dim], got shape {tuple(t.shape)}")
        if not t.is_floating_point():
            raise ValueError(f"{name} must be a floating-point tensor, got {t.dtype}")
    if qkv_format not in QKV_FORMATS:
        raise ValueError(f"qkv_format must be one of {QKV_FORMATS}, got {qkv_format!r}")
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    if kernel is not None and kernel not in KERNEL_NAMES:
        raise ValueError(f"kernel must be one of {KERNEL_NAMES} or None, got {kernel!r}")
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise ValueError(f"q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if k.device != q.device or v.device != q.device:
        raise ValueError(f"q, k, v must be on one device, got {q.device}, {k.device}, "
                         f"{v.device}")
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape, got {tuple(k.shape)} and "
                         f"{tuple(v.shape)}")
    if q.shape[:2] != k.shape[:2]:
        raise ValueError(f"q and k must agree on batch and local sequence ({qkv_format}), got "
                         f"{tuple(q.shape)} and {tuple(k.shape)}")
    if q.shape[3] != k.shape[3]:
        raise ValueError(f"q and k must have the same head_dim, got {q.shape[3]} and "
                         f"{k.shape[3]}")
    if q.shape[3] == 0:
        raise ValueError("head_dim (the last dim of q, k, v) must be positive, got 0")
    hq, hkv = q.shape[2], k.shape[2]
    if hkv == 0 or hq % hkv:
        raise ValueError(f"the number of q heads ({hq}) must be a multiple of the number of "
                         f"k/v heads ({hkv})")
    s_local = q.shape[1] if qkv_format == "bshd" else q.shape[0]
    per_rank = chunks_per_rank(layout)
    if cu_seqlens is None and (s_local == 0 or (layout != "whole_docs" and s_local % per_rank)):
        raise ValueError(
            f"sequence length {s_local * world} (local {s_local} x {world} ranks) must be "
            f"divisible by {per_rank * world} for layout {layout!r}")
    if softmax_scale is not None and not (isinstance(softmax_scale, (int, float))
                                          and not isinstance(softmax_scale, bool)
                                          and math.isfinite(softmax_scale)
                                          and softmax_scale > 0):
        raise ValueError(f"softmax_scale must be a finite positive number or None, got "
                         f"{softmax_scale!r}")
    if not isinstance(causal, bool):  # "False" or None would silently pick a mask
        raise ValueError(f"causal must be a bool, got {causal!r}")
    if (not isinstance(window_size, (tuple, list)) or len(window_size) != 2
            or not all(isinstance(w, int) and not isinstance(w, bool) and w >= -1
                       for w in window_size)):
        raise ValueError(f"window_size must be a pair of ints >= -1 (left, right), got "
                         f"{window_size!r}")
    if cu_seqlens is not None:
        return _validate_documents(cu_seqlens, q.shape[0] if qkv_format == "bshd" else q.shape[1],
                                   s_local, world, layout)
    return None


def _validate_documents(cu_seqlens, batch, s_local, world, layout) -> DocumentPack:
    """Check the document boundaries against this rank's shard; return their pack."""
    pack = pack_documents(cu_seqlens)  # read to the host once per boundaries tensor
    lens = pack.lens
    if batch != 1:
        raise ValueError(f"cu_seqlens needs batch size 1 (one packed sequence), got {batch}")
    need = local_length(layout, world, lens)
    if need != s_local:
        raise ValueError(
            f"cu_seqlens describes documents whose shard in layout {layout!r} is {need} tokens "
            f"per rank, but q holds {s_local}: shard with shard_seq(..., cu_seqlens=cu_seqlens)")
    return pack


@dataclasses.dataclass(frozen=True, eq=False)
class Prepared:
    """Everything about a call that its tensors' values do not change: made once per shape
    (and per document pack) and reused, so a repeated call costs the host a dictionary
    lookup instead of validation, layout, signature and planning."""

    cp: CPTopology
    sig: dict
    digest: int  # of the signature, for the ring messages' headers
    label: int  # of call_label
    spec: RingSpec  # without the call's tag
    keep_key: str
    ulysses_peers: tuple[int, ...] | None  # this rank's Ulysses group; None: no Ulysses


PREPARED: "collections.OrderedDict[tuple, Prepared]" = collections.OrderedDict()
PREPARED_CACHE = 64  # calls of distinct shapes, masks or packs kept


def remember(key: tuple, call: Prepared) -> None:
    PREPARED[key] = call
    if len(PREPARED) > PREPARED_CACHE:
        PREPARED.popitem(last=False)


def call_key(group, q, k, v, *options) -> tuple | None:
    """Everything a prepared call depends on, with each value's type (so that, say, causal=1
    is validated and refused, never served as causal=True); None if unhashable."""
    if not all(isinstance(t, torch.Tensor) for t in (q, k, v)):
        return None
    tensors = tuple((t.shape, t.stride(), t.dtype, t.device, t.requires_grad)
                    for t in (q, k, v))
    typed = []
    for value in options:
        if isinstance(value, torch.Tensor):  # boundaries: their pack, read once per tensor
            value = pack_documents(value)
        elif isinstance(value, AttentionKeep):
            value = (AttentionKeep, len(value) > 0)
        elif isinstance(value, (tuple, list)):
            value = (type(value), tuple((type(x), x) for x in value))
        typed.append((type(value), value))
    key = (group, tensors, torch.is_grad_enabled(), tuple(typed),
           os.environ.get("LOCAL_WORLD_SIZE"), os.environ.get("MEGATRON_BURST_PROFILE"))
    try:
        hash(key)
    except TypeError:
        return None
    return key


def prepare(q, k, v, group, world, causal, softmax_scale, window_size, layout, backward,
             qkv_format, intra_node_size, ulysses_size, cu_seqlens, kernel, keep,
             call_label, topology) -> Prepared:
    """Validate, resolve the layout, sign and plan one call (no communication)."""
    pack = _validate(q, k, v, world, causal, softmax_scale, window_size, layout,
                     qkv_format, cu_seqlens, kernel)
    cp = _topology(group, world, q, k, causal, backward, intra_node_size, ulysses_size,
                   topology)
    if keep is not None and not isinstance(keep, AttentionKeep):
        raise ValueError(f"keep must be a megatron_burst.remat.AttentionKeep or None, got "
                         f"{type(keep).__name__}")
    if pack is not None and capturing(q):
        raise ValueError("burst_attn with cu_seqlens cannot be captured in a CUDA graph: a "
                         "document pack changes its shapes with every batch")
    sig = agree.signature(
        q, k, v, None if pack is None else pack.described, causal=causal,
        softmax_scale=softmax_scale, window_size=window_size, layout=layout,
        backward=cp.backward, qkv_format=qkv_format, intra_node_size=cp.ranks_per_node,
        ulysses_size=cp.ulysses,
        kernel=kernel,  # the resolved layout: 'auto' must have resolved alike everywhere
        reuse_kept=keep is not None and torch.is_grad_enabled() and len(keep) > 0)
    spec = _ring_spec(q, group, world, cp, pack, causal, softmax_scale, window_size,
                      layout, qkv_format, kernel)
    # A new pack is planned here, before the check's collective: host work that then
    # overlaps what the GPU still has queued instead of following a synchronisation.
    spec.prepare(q.device, backward=bool(sig["requires_grad"]))
    return Prepared(cp, sig, headers.digest(sorted(sig.items())),
                    0 if call_label is None else headers.digest(call_label), spec,
                    _keep_key(sig), _ulysses_peers(group, world, cp.ulysses))


def _ulysses_peers(group, world: int, u: int) -> tuple[int, ...] | None:
    """The global ranks of this rank's Ulysses group: ``u`` consecutive group members."""
    if u == 1:
        return None
    members = group_ranks(group, world)
    first = members.index(dist.get_rank()) // u * u
    return tuple(members[first:first + u])


def capturing(t: torch.Tensor) -> bool:
    """Whether the current CUDA stream is capturing a graph."""
    return t.is_cuda and torch.cuda.is_current_stream_capturing()


def _ring_spec(q, group, world, cp: CPTopology, pack: DocumentPack | None, causal: bool,
               softmax_scale, window_size, layout: str, qkv_format: str,
               kernel: str | None) -> RingSpec:
    """Everything the ring loops need besides tensors, for this call (no communication)."""
    u, seq_first = cp.ulysses, qkv_format == "sbhd"
    s_local = q.shape[0] if seq_first else q.shape[1]
    sched = _schedule(pack, s_local * world, layout, world,
                      Mask(bool(causal), tuple(window_size)), u)
    topo = None
    if cp.ring_size > 1:
        members = group_ranks(group, world)
        me = members.index(dist.get_rank())
        ring_ranks = members[me % u::u]  # the same Ulysses slot of every group
        topo = RingTopology(ring_ranks, members[me], cp.inner_ring)
    return RingSpec(
        group=group, topo=topo, sched=sched,
        scale=float(softmax_scale) if softmax_scale is not None else default_scale(q.shape[3]),
        backward=cp.backward, seq_first=seq_first and u == 1, kernel=kernel,
        fixed_shapes=pack is None)


def _schedule(pack: DocumentPack | None, total: int, layout: str, world: int, mask: Mask,
              ulysses: int) -> RingSchedule:
    """The call's schedule: a plain sequence's from a small cache (its shape repeats every
    step), a pack's from the pack, so every layer and the backward share its plans."""
    if pack is None:
        return RingSchedule.of(layout, world, (total,), mask, ulysses)
    key = (layout, world, mask, ulysses)
    if key not in pack.schedules:
        pack.schedules[key] = RingSchedule.of(layout, world, pack.lens, mask, ulysses)
    return pack.schedules[key]


def _topology(group, world, q, k, causal, backward, intra_node_size, ulysses_size,
              topology: CPTopology | None) -> CPTopology:
    """The call's CPTopology: the caller's decided one (checked against the call), else the
    one resolver's (``options.resolve``) for these options and this shape."""
    heads = HeadShape(q.shape[2], k.shape[2], q.shape[3], q.element_size())
    options = BurstOptions(backward=backward, ulysses_size=ulysses_size,
                           intra_node_size=intra_node_size)
    if topology is not None:
        if not isinstance(topology, CPTopology):
            raise ValueError(f"topology must be a megatron_burst CPTopology or None, got "
                             f"{type(topology).__name__}")
        return check_decided(topology, options, cp=world, heads=heads)
    tokens = q.shape[0] * q.shape[1]  # bshd and sbhd alike: batch x local sequence
    members = group_ranks(group, world) if dist.is_initialized() else None
    per_node = cp_ranks_per_node(world, gpus_per_node=local_gpus(), group_ranks=members,
                                 rank=dist.get_rank() if members else None)
    return resolve(options, cp=world, heads=heads, tokens=tokens, cp_ranks_per_node=per_node,
                   causal=causal)


def _keep_key(sig: dict) -> str:
    """What a kept output is made for: the call's signature without its autograd fields."""
    return headers.describe_call({k: v for k, v in sig.items()
                                  if k not in ("requires_grad", "reuse_kept", "error")})
