"""``burst_attn``: the public entry point.

A call's arguments become one value (``call.BurstCall``, validated), prepared once per
value and shape (``prepare``: tensors checked, topology, kernel, signature, plans), compared
across the group (``agree``), tagged in every message with its number, signature and label
(``comm.headers``, on the ring and on the Ulysses all-to-all alike), and run (``burst``),
inside the Ulysses all-to-alls when the topology has them. Under full recompute a kept
output is handed only to the recompute of the forward that made it (``remat``).
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from . import agree, decision_check, first_use, prepare
from .burst import BurstAttentionFunction
from .call import ARGUMENTS, call_of, failed_signature
from ..comm import consensus, headers
from ..decide.topology import CPTopology
from ..decide.options import NotGiven
from ..plan.packs import DocumentPack
from ..plan.slices import SliceMask
from .remat import AttentionKeep, in_backward
from .sharding import group_name, group_size_rank
from .ulysses import heads_to_sequence, outputs_to_heads, sequence_to_heads


def burst_attn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               group: dist.ProcessGroup | None = None, *, causal: bool = False,
               softmax_scale: float | None = None, window_size: tuple[int, int] = (-1, -1),
               layout: str = NotGiven("zigzag"), backward: str = NotGiven("auto"),
               qkv_format: str = "bshd",
               intra_node_size: int | str | None = NotGiven(None),
               ulysses_size: int | str = NotGiven(1),
               cu_seqlens: torch.Tensor | DocumentPack | None = None, return_lse: bool = False,
               kernel: str | None = None, keep: AttentionKeep | None = None,
               call_label: int | str | None = None, topology: CPTopology | None = None,
               sinks: torch.Tensor | None = None, mask: SliceMask | None = None):
    """Exact attention over a sequence sharded across ``group`` (BurstAttention).

    ``mask``: a ``SliceMask`` (any union of full/causal/inv_causal/bi_causal slices), not
    with ``causal``, ``window_size`` or ``cu_seqlens`` (ValueError); ``layout`` then
    defaults to 'area' (balanced by visible area; shard with ``shard_seq(..., mask=)``).

    q: [b, s_local, hq, d]; k: [b, s_local, hkv, d]; v: [b, s_local, hkv, dv] (dv may differ
    from d, as in MLA; ``qkv_format="sbhd"`` swaps the first two dims). Returns out (q's
    shape with V's head dim, q's dtype and format), and with ``return_lse=True`` also lse
    [b, hq, s_local] fp32. Differentiable in q, k and v (and through lse too, exactly,
    whatever the output's gradient).
    ``sinks``: attention sinks, one logit per query head ([hq], any float dtype) that joins
    every row's softmax with no value (gpt-oss; zeros are softmax "off by one"),
    differentiable: its gradient covers this rank's rows (``sinks.py``).
    ``backward`` ('auto', 'burst', 'ring'; default 'auto'), ``ulysses_size`` (default 1) and
    ``intra_node_size`` (default None: a flat ring) may be ``"auto"``: the time model
    (``timing``, with the profile ``$MEGATRON_BURST_PROFILE`` or the shipped default)
    picks the fastest for this shape; ranks per node come from ``cluster``.
    ``topology``: a ``CPTopology`` already decided (``options.resolve``, e.g. once per run by
    the Megatron entry point), used instead of resolving those three; any of them passed
    with it must agree with it (an explicit ``ulysses_size=1`` too).
    ``kernel`` forces a local attention backend by name (``kernels.KERNEL_NAMES``); it is
    checked against every block of the call before any message moves, and a kernel that
    cannot compute one (cuDNN under a sliding window) raises ValueError.
    ``cu_seqlens`` may be a ``DocumentPack`` (``pack_documents``), made once per batch: its
    plans are then made once for all the layers that attend over the pack (a tensor is read
    at every call and matched by its content). With ``layout="pack_zigzag"`` the host never
    reads them: the pack is placed as one zigzag sequence and the kernels read the documents
    on the device (``kernels.device_calls``), so the call can be captured in a CUDA graph and
    replayed on the next pack (boundaries padded to a fixed count by repeating the last);
    a malformed or differing pack raises at the call after.
    ``keep`` (``remat.AttentionKeep``): under full recompute, a call without autograd keeps
    its output there and the recompute of the same inputs takes it instead of running the
    ring (see ``remat`` for why it can never take another forward's).
    ``call_label`` (e.g. the layer number) goes into every message's header with the call's
    number and signature (``headers``): a rank whose call pairs with a peer's call of
    another label raises instead of computing with the wrong messages.
    """
    consensus.poll()  # an earlier pass got another call's message, or the ranks' counts differ
    agree.require_member(group)  # first: a non-member's group size reads -1
    given = locals()  # the arguments, by name: the call is made of them (``call.ARGUMENTS``)
    world, _ = group_size_rank(group)
    prepared = _agreed(group, q, k, v, world, {name: given[name] for name in ARGUMENTS})
    if prepared.native and not return_lse and sinks is None and keep is None:
        return _native(q, k, v, prepared.bound)  # one aten op, its own autograd: nothing more
    tag = _numbered(prepared, group, q, world)
    out, lse = _attend(q, k, v, tag, group, prepared, _bound(prepared, group, cu_seqlens, q),
                       keep, sinks, return_lse)
    return (out, lse) if return_lse else out


def _agreed(group, q, k, v, world: int, arguments: dict):
    """The call (``BurstCall.of(arguments)``) prepared, and compared with the group's
    other ranks; whatever fails, the peers learn of it instead of waiting.

    A new signature's check is posted as soon as the call is signed and read after its plan
    is made, so the exchange travels while the host plans (``agree.begin``). A plan that
    fails after that fails alike on every rank that signed alike (it is made from the
    signature); where the signatures differ, every rank hears of the failure. What one rank
    alone can meet there (its GPU out of memory as the plan uploads its boundaries, a forced
    kernel's probe failing at a shape's first call) is then like a failure in the ring: the
    peers, past the check, wait until the process group's timeout."""
    begun: list = []
    try:
        call = call_of(arguments)
        prepared = prepare.lookup(
            group, q, k, v, call, world, arguments["sinks"],
            signed=(lambda sig: begun.append(agree.begin(group, sig))) if world > 1 else None)
    except Exception as err:
        if begun and begun[0] is not None:
            agree.check_failed_plan(group, begun[0], err)
        else:
            agree.check_agreement(group, failed_signature(consensus.error_text(err)))
        raise
    if world > 1:
        agree.check_agreement(group, prepared.sig, begun[0] if begun else None)
        while prepared.pending is not None:  # 'auto''s first use: every rank, together
            prepared = _settle(group, q, k, v, world, call, arguments, prepared)
    return prepared


def _settle(group, q, k, v, world: int, call, arguments: dict, prepared):
    """Measure this machine (``first_use``) or time the decision (``decision_check``), on
    every rank of the group after they agreed on the call, then prepare it again."""
    if prepared.pending == "check":
        decision_check.check(group, world, prepared.decision, call, q, k, v, arguments,
                             burst_attn)
    else:
        first_use.acquire(group, world, prepared.pending, q, k, v, call.causal, burst_attn)
    prepare.forget(group, q, k, v, call, world, arguments["sinks"])
    prepared = prepare.lookup(group, q, k, v, call, world, arguments["sinks"])
    agree.check_agreement(group, prepared.sig)
    return prepared


def _numbered(prepared, group, q, world: int) -> headers.CallTag | None:
    """The call's tag for the headers: its number on the group, digest and label.

    Numbered after the check, so a call every rank refused counts nowhere. A CUDA graph
    replays its messages as captured: no header to write or check there (nor one rank)."""
    if world > 1 and not prepare.capturing(q):
        return headers.CallTag(_next_call(group), prepared.digest, prepared.label)
    return None


def _native(q, k, v, bound):
    """A single rank's whole attention as its kernel's one differentiable op (CP=1)."""
    if bound.seq_first:
        q, k, v = q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)
    out = bound.kernel.native(q, k, v, bound.whole, bound.scale)
    return out.transpose(0, 1) if bound.seq_first else out


def _bound(prepared, group, cu_seqlens, q: torch.Tensor):
    """The call's plan, bound to its boundaries where the GPU reads them (checked there: the
    verdict comes at the call after)."""
    if not prepared.call.device_docs:
        return prepared.bound
    cu = _boundaries(cu_seqlens, q.device)
    agree.check_boundaries(group, cu, prepared.bound.plan.sides, prepared.call.layout,
                           replays=prepared.bound.replay)
    return prepared.bound.with_boundaries(cu)


def _boundaries(cu_seqlens, device: torch.device) -> torch.Tensor:
    """Boundaries read on the device, on the call's device (a pack's host copy goes up
    without the host waiting: pinned)."""
    cu = cu_seqlens.cu_seqlens if isinstance(cu_seqlens, DocumentPack) else cu_seqlens
    if cu.device == device:
        return cu
    if consensus.capturing():  # a replay would read a host buffer freed since
        raise ValueError(f"burst_attn in a CUDA graph capture with layout 'pack_zigzag' needs "
                         f"cu_seqlens on {device} (a graph input), got it on {cu.device}")
    return (cu.pin_memory() if device.type == "cuda" else cu).to(device, non_blocking=True)


def _attend(q, k, v, tag, group, prepared, bound, keep: AttentionKeep | None, sinks,
            return_lse: bool = False):
    """The ring (inside the Ulysses all-to-alls when there are any), or the kept output of
    this very forward under a recompute; keeping it on a first forward without autograd.
    ``bound``: the call's plan, bound to its boundaries where the GPU reads them."""
    kept = None
    inputs = (q, k, v) if sinks is None else (q, k, v, sinks)  # what a kept output is of
    if keep is not None and torch.is_grad_enabled():
        if in_backward():  # a checkpoint's recompute: its first forward may have kept it
            kept = keep.take(prepared.keep_key, inputs, group)
        else:  # a forward with autograd: this layer is not recomputed, nothing is for it
            keep.clear()
    if prepared.ulysses_peers is None:
        # NCCL and gloo send contiguous buffers; Megatron hands K/V as views of fused QKV.
        out, lse = ring = BurstAttentionFunction.apply(q.contiguous(), k.contiguous(),
                                                       v.contiguous(), bound, tag, kept, sinks,
                                                       return_lse)
    else:
        out, lse, ring = _ulysses_burst(q, k, v, bound, tag, group, prepared.ulysses_peers,
                                        prepared.call.qkv_format == "sbhd", kept, sinks,
                                        return_lse)
    if keep is not None and not torch.is_grad_enabled():
        keep.put(*ring, prepared.keep_key, inputs)  # the ring's own (out, lse)
    return out, lse


_CALLS: dict[str, int] = {}  # calls made on each group (the same on all its ranks)


def _next_call(group) -> int:
    name = group_name(group)
    _CALLS[name] = _CALLS.get(name, 0) + 1
    return _CALLS[name]


def calls_made(group) -> int:
    """How many calls this process made on ``group`` (the headers' call numbers)."""
    return _CALLS.get(group_name(group), 0)


def _ulysses_burst(q, k, v, bound, tag, group, peers, seq_first, kept, sinks,
                   return_lse: bool = False):
    """Heads -> sequence inside each Ulysses group (``peers``), the ring across groups, and
    back. Every all-to-all piece carries the call's header. Returns (out, lse, the ring's
    (out, lse)): a kept output is the ring's, so its recompute needs no all-to-all."""
    u = len(peers)
    if k.shape[2] < u:  # too few K/V heads to split: replicate each to U/hkv slots
        k = k.repeat_interleave(u // k.shape[2], dim=2)
        v = v.repeat_interleave(u // v.shape[2], dim=2)
    as_bshd = (lambda t: t.transpose(0, 1)) if seq_first else (lambda t: t)
    runs = bound.plan.member_runs  # the group's rows in position order, or None
    qs, ks, vs = heads_to_sequence([as_bshd(t) for t in (q, k, v)], peers, group, 1, 2, tag,
                                   runs)
    if sinks is not None:  # this rank's ring holds head slice u of every member's heads
        sinks = sinks.chunk(u)[peers.index(dist.get_rank())]
    ring = BurstAttentionFunction.apply(qs, ks, vs, bound, tag, kept, sinks, return_lse)
    if return_lse:  # one node: its backward trades both gradients on every rank
        out, lse = outputs_to_heads(ring[0], ring[1], peers, group, tag, runs)
    else:  # lse stays here: nobody reads it
        out, lse = sequence_to_heads(ring[0], peers, group, 1, 2, tag, runs), None
    return (out.transpose(0, 1).contiguous() if seq_first else out), lse, ring
