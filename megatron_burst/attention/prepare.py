"""A burst_attn call prepared once: tensors checked, topology resolved, kernel chosen, signed,
planned.

Every check here uses only this rank's arguments and the group's size, so a bad call
raises ``ValueError`` on every rank before any byte is sent, instead of leaving the ranks
that passed waiting forever on the ones that failed. Arguments that are fine on each rank
but differ between ranks are caught next, by ``agree.check_agreement`` (in ``api``).

What a call's tensors' values do not change (validation, topology, kernel, signature, the
ring's schedule and kernel-call plans) is made once per call value (``call.BurstCall``),
tensor shapes and, where 'auto' reads them, the cluster's profile and ranks per node
(``call_key``), and looked up after, so a repeated call costs the host a dictionary lookup.
"""
from __future__ import annotations

import collections
import dataclasses
from typing import Callable

import torch
import torch.distributed as dist

from ..decide import cluster
from .call import BurstCall, signature
from ..comm import headers
from ..decide.topology import CPTopology, HeadShape
from ..kernels.cuda import FlashAttnPackage, TorchFlashAttention
from ..kernels.merge import compile_variants, fuses
from ..kernels.selection import check_kernel, default_scale, has_native, pick_kernel
from ..kernels.thresholds import forward_min_area
from ..decide.options import (Decision, check_decided, decide, deciding_profile,
                               fixed_topology, resolve)
from . import decision_check, first_use, varying_masks
from ..plan.layouts import MASK, Layout, layout_named
from ..plan.placement import local_length
from .call_plan import plan_for, plan_key, ring_key
from .bound_plan import BoundPlan
from ..plan.schedule import Block, Mask
from ..plan.slices import SliceMask
from .replay import wanted as replays
from .sinks import check_sinks
from .sharding import group_name, group_ranks
from ..decide.pack_load import PackLoad


def _validate(q, k, v, world: int, call: BurstCall) -> None:
    """Raise ValueError for tensors that do not fit each other or the call."""
    fmt = call.qkv_format
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{name} must be 4-D [{fmt[0]}, {fmt[1]}, heads, head_dim], got "
                             f"shape {tuple(t.shape)}")
        if not t.is_floating_point():
            raise ValueError(f"{name} must be a floating-point tensor, got {t.dtype}")
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise ValueError(f"q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if k.device != q.device or v.device != q.device:
        raise ValueError(f"q, k, v must be on one device, got {q.device}, {k.device}, "
                         f"{v.device}")
    if k.shape[:3] != v.shape[:3]:
        raise ValueError(f"k and v must have the same shape but for V's head dim (which may "
                         f"differ, as in MLA), got {tuple(k.shape)} and {tuple(v.shape)}")
    if q.shape[:2] != k.shape[:2]:
        raise ValueError(f"q and k must agree on batch and local sequence ({fmt}), got "
                         f"{tuple(q.shape)} and {tuple(k.shape)}")
    if q.shape[3] != k.shape[3]:
        raise ValueError(f"q and k must have the same head_dim, got {q.shape[3]} and "
                         f"{k.shape[3]}")
    if q.shape[3] == 0 or v.shape[3] == 0:
        raise ValueError(f"head_dim (the last dim of q, k, v) must be positive, got "
                         f"{q.shape[3]} and {v.shape[3]} (V)")
    hq, hkv = q.shape[2], k.shape[2]
    if hkv == 0 or hq % hkv:
        raise ValueError(f"the number of q heads ({hq}) must be a multiple of the number of "
                         f"k/v heads ({hkv})")
    s_local = q.shape[1] if fmt == "bshd" else q.shape[0]
    if call.mask is not None:
        _validate_mask(call, s_local, world)
        return
    if call.cu_seqlens is None or call.device_docs:  # device docs: a plain sequence's rows
        _check_length(layout_named(call.layout), s_local, world)
        if call.cu_seqlens is None:
            return
    if (q.shape[0] if fmt == "bshd" else q.shape[1]) != 1:
        raise ValueError("cu_seqlens needs batch size 1 (one packed sequence), got "
                         f"{q.shape[0] if fmt == 'bshd' else q.shape[1]}")
    if call.device_docs:
        return
    need = local_length(call.layout, world, call.cu_seqlens.lens)
    if need != s_local:
        raise ValueError(
            f"cu_seqlens describes documents whose shard in layout {call.layout!r} is {need} "
            f"tokens per rank, but q holds {s_local}: shard with shard_seq(..., "
            f"cu_seqlens=cu_seqlens)")


def _validate_mask(call: BurstCall, s_local: int, world: int) -> None:
    """A mask's slices must lie in the sequence, and its layout must place the tokens."""
    total = s_local * world
    if call.mask.extent > total:
        raise ValueError(f"mask names positions up to {call.mask.extent} but the sequence has "
                         f"{total} tokens (local {s_local} x {world} ranks)")
    _check_length(layout_named(call.layout, MASK), s_local, world)


def _check_length(layout: Layout, s_local: int, world: int) -> None:
    """A sequence of ``s_local`` tokens per rank must fill the layout's chunks."""
    divisor = layout.divisor(world)
    if s_local == 0 or (s_local * world) % divisor:
        raise ValueError(f"sequence length {s_local * world} (local {s_local} x {world} ranks) "
                         f"must be divisible by {divisor} for layout {layout.name!r}")


@dataclasses.dataclass(frozen=True, eq=False)
class Prepared:
    """Everything about a call that its tensors' values do not change: made once per key
    (``call_key``) and reused, so a repeated call costs the host a dictionary lookup."""

    call: BurstCall
    topology: CPTopology
    sig: dict
    digest: int  # of the signature, for every message's header
    label: int  # of call_label
    bound: BoundPlan
    keep_key: str  # what a kept output is made for: the signature without autograd's part
    ulysses_peers: tuple[int, ...] | None  # this rank's Ulysses group; None: no Ulysses
    # A single rank's whole attention is one kernel op that aten differentiates itself:
    # a call that needs no lse is that op and nothing else (``kernels.selection.has_native``).
    native: bool = False
    # 'auto''s first use, to run on every rank after the ranks agreed (``api``): a
    # ``MachineKey`` (measure this machine, ``first_use``), "check" (time the decision,
    # ``decision_check``), or None (nothing: the call is settled).
    pending: object = None
    decision: Decision | None = None


PREPARED: "collections.OrderedDict[tuple, Prepared]" = collections.OrderedDict()
PREPARED_CACHE = 64  # calls of distinct shapes, masks or packs kept


def call_key(group, q, k, v, call: BurstCall, world: int, sinks=None) -> tuple:
    """Everything a prepared call depends on, by value: the group's name, the call, the
    tensors' shapes, strides, dtype, device and autograd state, and, where 'auto' is to be
    settled over more than one rank, the profile named and the settings 'auto' reads
    (``cluster.view_key``: read once per process, no file stat per call)."""
    tensors = (q.shape, q.stride(), q.dtype, q.device, q.requires_grad,
               k.shape, k.stride(), k.dtype, k.device, k.requires_grad,
               v.shape, v.stride(), v.dtype, v.device, v.requires_grad)
    if sinks is not None:
        tensors += (sinks.shape, sinks.dtype, sinks.device, sinks.requires_grad)
    cluster_state = (call.options.profile, cluster.view_key()) \
        if world > 1 and call.needs_cluster else None
    return (group_name(group), world, call, tensors, torch.is_grad_enabled(), cluster_state)


def lookup(group, q, k, v, call: BurstCall, world: int, sinks=None,
           signed: Callable[[dict], None] | None = None) -> Prepared:
    """The prepared call for this key, preparing (and remembering) it on a miss (``signed``:
    see ``prepare``)."""
    key = call_key(group, q, k, v, call, world, sinks)
    found = PREPARED.get(key)
    if found is None:
        found = prepare(q, k, v, group, world, call, sinks, signed)
        PREPARED[key] = found
        if len(PREPARED) > PREPARED_CACHE:
            PREPARED.popitem(last=False)
    return found


def forget(group, q, k, v, call: BurstCall, world: int, sinks=None) -> None:
    """Drop this key's prepared call (its 'auto' first use changed what it decides)."""
    PREPARED.pop(call_key(group, q, k, v, call, world, sinks), None)


def prepare(q, k, v, group, world: int, call: BurstCall, sinks=None,
            signed: Callable[[dict], None] | None = None) -> Prepared:
    """Validate, resolve the topology, choose the kernel, sign and plan one call (no
    communication). ``signed(sig)`` runs once the call is signed, before its plan is made:
    the ranks' check of the signature travels meanwhile (``api``)."""
    _validate(q, k, v, world, call)
    check_sinks(sinks, q.shape[2], q.device)
    topology, decision, pending = _topology(group, world, q, k, v, call)
    if capturing(q) and pending is not None:
        raise ValueError("burst_attn's first call with 'auto' on this machine cannot be "
                         "captured in a CUDA graph: it measures and times (run it once "
                         "before capturing, or force the topology)")
    if capturing(q) and call.cu_seqlens is not None and not call.device_docs:
        raise ValueError("burst_attn with cu_seqlens cannot be captured in a CUDA graph in "
                         f"layout {call.layout!r}: a document pack changes its shapes with "
                         "every batch (layout 'pack_zigzag' reads them on the device)")
    if capturing(q) and call.keep:
        raise ValueError("burst_attn with keep= cannot be captured in a CUDA graph: matching "
                         "a kept output to its recompute reads the host")
    if world > 1 and fuses(q.device, q.dtype, v.shape[3]) and not capturing(q):
        # Not at a later pack's first merge; and before the check is posted, so that a
        # compile failing on one rank is told to its peers (``api._agreed``).
        compile_variants(q.device, q.dtype, v.shape[3])
    sig = signature(call, q, k, v, topology, sinks)
    if signed is not None:
        signed(sig)
    bound = _bind_plan(q, k, v, group, world, topology, call)
    keep_key = headers.describe_call({n: x for n, x in sig.items()
                                      if n not in ("requires_grad", "error")})
    peers = _ulysses_peers(group, world, topology.ulysses)
    native = (peers is None and isinstance(bound.whole, Block)
              and has_native(bound.kernel, bound.whole))
    return Prepared(call, topology, sig, headers.digest(sorted(sig.items())),
                    0 if call.call_label is None else headers.digest(call.call_label), bound,
                    keep_key, peers, native, pending, decision)


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


def _bind_plan(q, k, v, group, world: int, topology: CPTopology, call: BurstCall) -> BoundPlan:
    """The call's plan (``call_plan.plan_for``: made once per key, shared by every call of
    it) with the kernel, chosen for and checked against every block the plan runs."""
    u, seq_first = topology.ulysses, call.qkv_format == "sbhd"
    s_local = q.shape[0] if seq_first else q.shape[1]
    batch = q.shape[1] if seq_first else q.shape[0]
    # The ring's heads: Ulysses splits them U ways (K/V replicated where fewer than U).
    heads = (q.dtype, q.shape[2] // u, max(k.shape[2] // u, 1), q.shape[3], q.device)
    kernel = pick_kernel(call.kernel, *heads, dv=v.shape[3])
    pack = None if call.device_docs else call.cu_seqlens
    # A slice mask that changes from call to call: no block to cuDNN (a graph per shape).
    shape_free = isinstance(call.mask, SliceMask) and varying_masks.follows_data(
        (call.layout, world, s_local, batch, u, heads, v.shape[3]), call.mask)
    plan = plan_for(plan_key(
        call.layout, world, pack if pack is not None else (s_local * world,),
        call.mask if call.mask is not None else Mask(call.causal, call.window_size), u,
        ring_key(group, world, topology.ulysses, topology.positions_per_node),
        topology.backward, batch=batch,
        dense_min_area=(None if shape_free or pack is not None  # (a pack plans no threshold)
                        else forward_min_area(kernel, q.numel())),
        gpu_bound_min_area=kernel.gpu_bound_min_area, device_docs=call.device_docs))
    if call.device_docs and q.is_cuda and not kernel.capabilities.one_launch_varlen:
        raise ValueError(f"layout 'pack_zigzag' reads its documents on the device: on CUDA it "
                         f"needs a kernel that runs a varlen call in one launch, and "
                         f"{kernel.name!r} does not (leave kernel=None, or force "
                         f"{TorchFlashAttention.name!r} or {FlashAttnPackage.name!r})")
    check_kernel(kernel, call.kernel, *heads, blocks=plan.blocks, varlen=batch == 1,
                 dv=v.shape[3])
    plan.upload(q.device)  # a pack planned ahead on the host gets its boundaries here
    scale = call.softmax_scale if call.softmax_scale is not None else default_scale(q.shape[3])
    return BoundPlan(group, plan, scale, seq_first and u == 1, kernel,
                     replay=replays(call, q, plan))


def _topology(group, world: int, q, k, v, call: BurstCall
              ) -> tuple[CPTopology, Decision | None, object]:
    """(the call's CPTopology, 'auto''s decision, what its first use must still do): the
    caller's decided topology (checked against what the call's options fix), else the one
    resolver's for these options, this shape and this machine's profile (``first_use``),
    or the verdict of a check of that decision (``decision_check``)."""
    heads = HeadShape.of_tensors(q, k, v)
    if call.topology is not None:
        return check_decided(call.topology, call.options, cp=world, heads=heads), None, None
    options = call.options
    # bshd and sbhd alike: batch x local sequence. A call with none (batch 0, a pack of empty
    # documents) has no time to model: it is decided as one token (the same on every rank).
    tokens = max(q.shape[0] * q.shape[1], 1)
    if not (options.has_auto and world > 1 and dist.is_initialized()):
        return resolve(options, cp=world, heads=heads, tokens=tokens, max_intra_node_size=None,
                       causal=call.causal), None, None
    measured, to_measure = first_use.machine_profile(group, world, q.device, options)
    if to_measure is not None:  # decided once this machine is measured; until then (the
        # ranks' agreement) the plainest topology the options allow stands in
        return fixed_topology(options, cp=world, heads=heads), None, to_measure
    if isinstance(options.intra_node_size, int):  # stated: the double ring's own count
        max_intra_node_size = options.intra_node_size
    else:
        gpus = cluster.gpus_per_node(
            profile_gpus=deciding_profile(options, measured).gpus_per_node)
        max_intra_node_size = cluster.max_intra_node_size(
            world, gpus, group_ranks=group_ranks(group, world), rank=dist.get_rank())
    work, pack = _work(call, world, q)
    decision = decide(options, cp=world, heads=heads, tokens=tokens,
                      max_intra_node_size=max_intra_node_size, causal=call.causal,
                      machine=measured, pack=pack, work=work)
    kept = decision_check.verdict(group, decision, call)
    if kept is not None:
        return kept, decision, None
    return decision.topology, decision, "check" if decision_check.wanted(decision) else None


def _work(call: BurstCall, world: int, q: torch.Tensor):
    """(what 'auto' keys a call's work by beyond its shape, the callable that makes its load)
    for a call whose work is not a plain causal or full sequence's: a document pack (its
    packs share the first one's load, ``decide.loads.first_load``), a slice mask (by value), a
    window (by value); (None, None) for a plain call (``timing.predict`` prices it)."""
    if call.device_docs:  # planned as a plain sequence, the documents read on the GPU
        return None, None
    if call.cu_seqlens is not None:  # a model's windowed and full layers: two works
        return ("documents", tuple(call.window_size)), lambda: PackLoad.of_pack(
            call.cu_seqlens.lens, call.layout, call.causal, call.window_size)
    seq_first = call.qkv_format == "sbhd"
    total, batch = q.shape[0 if seq_first else 1] * world, q.shape[1 if seq_first else 0]
    mask = call.mask
    if mask is None and tuple(call.window_size) != (-1, -1):
        mask = Mask(call.causal, tuple(call.window_size))
    if mask is None:
        return None, None
    return mask, lambda: PackLoad.of_mask(mask, call.layout, total, batch)
