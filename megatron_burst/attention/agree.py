"""Every rank of a ``burst_attn`` call must pass the same arguments: this checks that they do.

Why: the ring trusts that all ranks run one schedule. A rank that passes ``causal=False``
while its peers pass True, other document boundaries, or fp32 against bf16, either hangs
the ring (its messages or step counts differ from its peers') or silently computes wrong
attention. ``prepare._validate`` cannot see it, since each rank's arguments are fine on their
own. So before the first byte of a call moves, the ranks trade a fingerprint (one 63-bit
hash per argument, one tiny all-gather) and, if any field differs, all raise the same
ValueError naming the fields and which ranks passed what.

Cost. ``MEGATRON_BURST_AGREE`` (the same on every rank) picks when to check:
``first`` (default) the first call per distinct signature on each group, ``always``
every call (debugging), ``off`` never. Verified signatures are cached per group, so
steady-state training repeats known signatures and pays nothing. With packed documents
every batch brings new boundaries, hence a new signature: those calls are all checked
(one all-gather of one digest; the boundaries are already on the host). The exchange goes
over the group's gloo twin (``comm.host_channel``), so the host never waits for the GPU's
queue, and a new signature's is posted as soon as the call is signed (``begin``, from
``api``) and read after its plan is made: it travels while the host plans.

Why the cache cannot make ranks diverge: a rank skips the collective only on a cache hit,
so all ranks of the group must always agree on hit or miss, or one would wait in the
all-gather while another is already in the ring.
- Each rank's cache for a group changes only when a check passes, i.e. when every rank
  of the group passed the same signature; it is then inserted, on every rank, at the
  same call. Eviction is first-in-first-out at a fixed size, and a hit reorders nothing.
  So the cache is a function of the group's history of verified signatures, the same
  on every rank, even after calls that went wrong.
- Hence in a call where all ranks pass the same signature they all hit or all miss:
  a correct program never diverges.
- In a call where ranks disagree: if no rank's signature is cached (the usual case: a
  bug is there from its first call, or comes with a new shape) all ranks check and all
  raise the same ValueError. The residual case is a rank repeating a signature verified
  within the last ``CACHE_SIZE`` signatures while a peer passes another one. No
  communication-free rule can catch it: a rank that sends nothing learns nothing about
  its peers. If every rank hits (each repeats some verified signature), the call runs
  unchecked, as without this module. If some hit and some miss, the missing ranks wait
  in the all-gather while the others wait in the ring: on CPU both sides raise after
  ``MEGATRON_BURST_TIMEOUT_S`` (the check's error says why), on NCCL the process
  group's timeout ends it. ``always`` catches both cases at one tiny collective per call.
So ``first`` never hangs a program that passes agreeing arguments, and turns a
disagreement into an error whenever it can; it is the default.

A rank whose own arguments are invalid joins the check too, with
``call.failed_signature`` (its error in place of the arguments), so its peers raise the
same error naming it instead of waiting for it in the ring.

Outside this argument: every rank must run with the same mode (a rank with ``off`` never
joins the collective its peers run).
"""
from __future__ import annotations

import collections
from typing import Mapping

import torch
import torch.distributed as dist

from .call import failed_signature
from ..comm import consensus
from ..comm.headers import digest_text
from ..comm.settings import AGREE_ENV, AGREE_MODES, current
from . import replay
from .sharding import group_name, group_ranks

MODE_ENV, MODES = AGREE_ENV, AGREE_MODES  # the setting, read once (``comm.settings``)
CACHE_SIZE = 256  # verified signatures kept per group

_CACHES: dict[str, collections.OrderedDict] = {}  # group name -> verified signatures


def require_member(group: dist.ProcessGroup | None) -> None:
    """Raise ValueError, before any communication, if this process is not in ``group``."""
    if group is None or not dist.is_available() or not dist.is_initialized():
        return
    # dist.new_group hands non-members a placeholder whose rank and size read -1.
    if dist.get_rank(group) < 0:
        raise ValueError(
            f"burst_attn: this process (global rank {dist.get_rank()}) is not a member of "
            f"the group it passed (dist.new_group returns a placeholder to the ranks it "
            f"leaves out): pass the context-parallel group this rank belongs to")


def check_agreement(group: dist.ProcessGroup | None, sig: Mapping[str, object],
                    begun: consensus.Exchange | None = None) -> None:
    """Raise the same ValueError on every rank of ``group`` if their ``sig`` differ.

    Call on every rank, with the same mode, before the call's first communication.
    ``begun``: the exchange ``begin`` posted for this ``sig`` (read here, not posted again).
    """
    name = _wanted(group, sig) if begun is None else group_name(group)
    if name is None:
        return
    if consensus.capturing():
        raise ValueError(
            "burst_attn inside a CUDA graph capture needs its arguments checked before: run "
            "the same call once outside the capture first (make_graphed_callables' warm-up "
            f"does), with {MODE_ENV}=first (the default), not 'always'")
    # One number per rank: the whole signature's digest. Only where they differ (every
    # rank sees it, so every rank takes this path) are the fields traded to name them.
    whole = (begun or _posted(group, sig)).values()
    if len({row[0] for row in whole}) > 1:
        _raise_differences(group, sig)
    cache = _CACHES[name]
    cache[tuple(sig.items())] = None
    if len(cache) > CACHE_SIZE:
        cache.popitem(last=False)  # the oldest: the same one on every rank


def check_failed_plan(group: dist.ProcessGroup | None, begun: consensus.Exchange,
                      error: Exception) -> None:
    """This rank's plan failed after ``begin`` posted its signature. Where every rank signed
    alike the plan fails alike on each (it is made from the signature): return, and the
    caller raises its own error. Else the fields are traded as for a rank that failed
    before signing, and every rank raises the same ValueError naming this failure."""
    if len({row[0] for row in begun.values()}) > 1:
        _raise_differences(group, failed_signature(consensus.error_text(error)))


def _raise_differences(group: dist.ProcessGroup | None, sig: Mapping[str, object]) -> None:
    """Trade ``sig``'s fields' hashes (the ranks' digests differed) and raise the ValueError
    that names the fields that differ and who passed what, the same on every rank."""
    names = sorted(sig)
    table = _exchange(group, [_field_hash(n, sig[n]) for n in names])
    differing = [i for i, column in enumerate(zip(*table)) if len(set(column)) > 1]
    raise ValueError(_disagreement(group, sig, [names[i] for i in differing],
                                   [[row[i] for i in differing] for row in table]))


def begin(group: dist.ProcessGroup | None,
          sig: Mapping[str, object]) -> consensus.Exchange | None:
    """Post the check of ``sig`` now, where ``check_agreement`` will want one, so that it
    travels while the call is planned; ``check_agreement(group, sig, begun)`` reads it. The
    same decision as there (mode, cache, peers), so every rank posts alike. Not inside a
    graph capture (``check_agreement`` raises there)."""
    if consensus.capturing() or _wanted(group, sig) is None:
        return None
    return _posted(group, sig)


def _wanted(group: dist.ProcessGroup | None, sig: Mapping[str, object]) -> str | None:
    """The group's name where ``sig`` is to be checked now (the mode, agreed at the group's
    first check, asks for it, it was not verified before under ``first``, and the group has
    peers), else None."""
    mode = current().agree
    if not dist.is_available() or not dist.is_initialized():
        return None
    name, peers = group_name(group), dist.get_world_size(group) > 1
    if name not in _MODES and peers:
        _agree_on_mode(group, name, mode)
    if mode == "off":
        return None
    cache = _CACHES.setdefault(name, collections.OrderedDict())
    if mode == "first" and tuple(sig.items()) in cache:
        return None  # verified with every rank before; see the module docstring for why
    return name if peers else None  # alone: nobody to disagree with


def _posted(group: dist.ProcessGroup | None, sig: Mapping[str, object]) -> consensus.Exchange:
    """The exchange of ``sig``'s digest, posted."""
    names = sorted(sig)
    return consensus.Exchange(group, [digest_text(repr([(n, sig[n]) for n in names]))],
                              *_WAITING)


_MODES: dict[str, str] = {}  # group name -> the mode its ranks agreed on


def _agree_on_mode(group: dist.ProcessGroup | None, name: str, mode: str) -> None:
    """At a group's first check, whatever each rank's mode (``off`` too): every rank joins
    one exchange of its mode, and if they differ all raise the same ValueError. A rank with
    ``off`` that skipped the check while its peers waited in it would leave them waiting."""
    if consensus.capturing():
        raise ValueError(f"burst_attn's first call on a group must run outside a CUDA graph "
                         f"capture (its ranks compare {MODE_ENV} then)")
    table = _exchange(group, [digest_text(mode)])
    if len({row[0] for row in table}) > 1:
        modes: list = [None] * dist.get_world_size(group)
        dist.all_gather_object(modes, mode, group=group)
        said = ", ".join(f"rank {r}: {m!r}" for r, m in zip(group_ranks(group), modes))
        raise ValueError(f"burst_attn: {MODE_ENV} differs between the ranks of a group "
                         f"({said}); set it alike on every rank")
    _MODES[name] = mode


def _field_hash(name: str, value: object) -> int:
    return digest_text(f"{name}={value!r}")


_WAITING = ("for the other ranks to join burst_attn's argument check",
            "a rank failed, is stuck, or skipped the check because it repeated arguments the "
            f"group verified earlier while this rank passed new ones (the ranks disagree; "
            f"{MODE_ENV}=always pins it down)")


def _exchange(group: dist.ProcessGroup | None, fingerprint: list[int]) -> list[list[int]]:
    """All ranks' fingerprints, in group rank order (``consensus.gather``)."""
    return consensus.gather(group, fingerprint, *_WAITING)


def _disagreement(group: dist.ProcessGroup | None, sig: Mapping[str, object],
                  names: list[str], table: list[list[int]], what: str = "burst_attn") -> str:
    """The error message, built only from gathered data so every rank prints the same.

    The hashes say who disagrees; one more exchange (on this error path only) fetches
    the values to print.
    """
    ranks = group_ranks(group)
    values: list = [None] * len(ranks)
    dist.all_gather_object(values, {n: sig[n] for n in names}, group=group)
    if "error" in names:  # some rank's own arguments were invalid: that is the news
        failed = [(ranks[p], v["error"]) for p, v in enumerate(values) if v["error"]]
        return "; ".join(f"{what} failed on rank {r}: {msg}" for r, msg in failed) + (
            " (every rank of the group raises this error)")
    parts = []
    for j, name in enumerate(names):
        holders: dict[int, list[int]] = {}  # hash -> positions, in first-seen order
        for pos, row in enumerate(table):
            holders.setdefault(row[j], []).append(pos)
        said = [f"{_ranks_text([ranks[p] for p in ps])} passed {values[ps[0]][name]!r}"
                for ps in holders.values()]
        parts.append(f"{name!r}: " + ", ".join(said))
    return ("burst_attn: ranks disagree on " + "; on ".join(parts)
            + " (every rank of the group must pass the same arguments)")


def _ranks_text(ranks: list[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {ranks}"


def tell_peers(group: dist.ProcessGroup | None, error: Exception) -> None:
    """Raise ``error`` here and, through the argument check, on every rank of ``group``: what
    ``burst_attn`` does when its own checks fail (the caller's checks fail alike)."""
    check_agreement(group, failed_signature(consensus.error_text(error)))
    raise error


def check_outcome(group: dist.ProcessGroup | None, error: Exception | None,
                  what: str = "burst_attn") -> None:
    """For a check whose result can differ by rank and by call (it reads the call's data):
    every rank's outcome, every call, in one small all-gather; if any failed, every rank
    raises the same ValueError naming the ranks and their errors (``what`` names the check:
    "burst_attn", "the document batch", ...)."""
    if not consensus.shared(group):
        if error is not None:
            raise error
        return
    said = None if error is None else consensus.error_text(error)
    table = _exchange(group, [_field_hash("error", said)])
    if len({row[0] for row in table}) > 1 or said is not None:
        raise ValueError(_disagreement(group, failed_signature(said) if said else
                                       {"error": None}, ["error"], table, what))


def check_boundaries(group: dist.ProcessGroup | None, cu: torch.Tensor, sides,
                     layout: str, replays: bool = False) -> None:
    """Boundaries the GPU reads (``sides``: the plan's ``device_calls.BoundarySides``) must
    start at 0, never decrease, end at the sequence's tokens, and be the same on every rank.

    Checked on the device, the host never waiting: each rank's verdict and a digest of its
    boundaries are gathered there and come home behind an event, and the call after
    (``consensus.poll``) raises the same ValueError on every rank. Meanwhile the call runs
    within its rows whatever the boundaries hold (``device_calls``). Inside a CUDA graph
    capture nothing is checked: a replay brings nothing home.

    ``replays`` (the call's passes may replay, ``attention.replay``): the digest and its
    gather replay from a CUDA graph of their own too. Eagerly they are some ten launches and
    a collective, half a millisecond of an eager pack_zigzag call's host time on 2x H100
    (0.74 ms against 0.24 without the check, the forward at 8K tokens a GPU)."""
    if consensus.capturing():
        return
    peers = consensus.shared(group)
    ranks = group_ranks(group) if peers else [
        dist.get_rank() if dist.is_available() and dist.is_initialized() else 0]
    table, weights = None, _weights(len(cu), cu.device)  # an input: a graph copies it in
    if replays and peers and consensus.device(group) == cu.device:
        key = ("boundaries", group_name(group), sides.total)
        table = replay.function(key, lambda c, w: (consensus.device_table(
            group, _word(c, sides.total, w)),), (cu, weights), fresh=False)
    gathered = consensus.Gathered.arrived(table[0]) if table else consensus.Gathered(
        group, _word(cu, sides.total, weights), "for the other ranks' cu_seqlens check")

    def verdict() -> None:
        words = gathered.values()
        said = f"burst_attn (layout {layout!r}: cu_seqlens is checked on the device, and this " \
               f"is raised on every rank once the check is home: on a GPU, at the call after)"
        bad = [r for r, w in zip(ranks, words) if w & 1]
        if bad:
            raise ValueError(f"{said}: cu_seqlens must start at 0, never decrease and end at "
                             f"the sequence's {sides.total} tokens; {_ranks_text(bad)} passed "
                             f"boundaries that do not")
        if len({w >> 1 for w in words}) > 1:
            raise ValueError(f"{said}: ranks {ranks} passed different cu_seqlens (every rank "
                             f"of the group must pass the same boundaries)")

    if gathered.event is None:
        verdict()
    else:
        consensus.defer(verdict, gathered.event)


def _word(cu: torch.Tensor, total: int, weights: torch.Tensor) -> torch.Tensor:
    """The boundaries' digest times two, plus one where they are malformed: not starting at
    0, decreasing somewhere, or not ending at ``total`` (device work; no tensor but its
    inputs, so a CUDA graph of it reads no memory it does not hold)."""
    malformed = (cu[1:] < cu[:-1]).any() | (cu[0] != 0) | (cu[-1] != total)
    return (cu.to(torch.int64) * weights).sum() * 2 + malformed


_WEIGHTS: dict[tuple[int, str], torch.Tensor] = {}


def _weights(n: int, device: torch.device) -> torch.Tensor:
    """Fixed odd int64 weights of a boundaries digest (sum of weight x boundary, wrapping),
    the same on every rank; kept per length and device (a few lengths per run)."""
    key = (n, str(device))
    if key not in _WEIGHTS:
        gen = torch.Generator().manual_seed(0x5EED)
        weights = torch.randint(0, 2 ** 62, (n,), generator=gen, dtype=torch.int64) * 2 + 1
        _WEIGHTS[key] = weights.to(device)
        if len(_WEIGHTS) > 64:
            _WEIGHTS.pop(next(iter(_WEIGHTS)))
    return _WEIGHTS[key]
