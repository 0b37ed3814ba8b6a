"""'auto' on the machine it runs on: the profile measured here, at first use if need be.

Where no profile is named (``profile=``, ``$MEGATRON_BURST_PROFILE``), 'auto' decides from a
profile of this machine (``decide.machine``: keyed by GPU model, GPUs per node, link kind,
NCCL version and the emulator's virtual links). Preparing a call only asks whether this
process already holds one (``machine_profile``: no communication). If not, the call's first
use, after the ranks agreed on it, runs ``acquire`` on every rank of its group together:

1. rank 0 of the group looks for one (its cache, then the shipped profiles) and broadcasts
   what it found: every rank takes the same profile, or every rank measures;
2. measuring times, at the call's own sizes and shapes, the ring hops inside and across
   nodes, the Ulysses all-to-all, the local kernel, a copy, and the host's cost per call,
   per ring step and per new pack (calls of the call's shape, a flat ring's and Ulysses'
   over the whole group, ``measure.HostShape``), in seconds; rank 0's figures are
   broadcast, so every rank decides from the same numbers;
3. the profile is cached (``machine.store``) and its duration logged; a later call or run
   on this machine reads the cache and measures nothing.
"""
from __future__ import annotations

import dataclasses
import functools
import itertools
import logging
import random
import statistics
import time

import torch
import torch.distributed as dist

from ..comm import consensus, emulator
from ..comm.settings import CACHE_ENV, MEASURE_ENV, current
from ..decide import cluster, cost, machine
from ..decide.options import BurstOptions
from ..decide.timing import DEFAULT_PROFILE, Profile, candidates, load_profile
from ..decide.topology import HeadShape
from . import measure
from .sharding import group_name, group_ranks

logger = logging.getLogger(__name__)

# Seconds of sustained kernel calls before the kernel is timed (``measure.measure_kernels``).
SETTLE_S = 1.0
# Timed runs of each call the host's cost is read from (``measure.step_and_call``).
HOST_REPEAT = 7
# Documents in the packs a new pack's host cost is timed at (``pack_fields``): it grows
# with them (a pack's plan, its kernel calls), so two counts give a fixed cost and one per
# document; each pack's shares fall by PACK_DECAY a document (``pack_lengths``: eight of
# them are 41%, 25%, 15%, ... 1%, as ``benchmarks/auto_check.py``'s mix).
PACK_DOCS = (4, 16)
PACK_DECAY = 0.6
_KNOWN: dict[tuple, Profile] = {}  # (group name, MachineKey) -> this machine's profile
_SAID: set = set()  # what was logged once per process


def machine_key(group, world: int, device: torch.device) -> machine.MachineKey:
    """This machine's key as the call's group sees it (no communication)."""
    per = cluster.gpus_per_node().gpus_per_node
    members = group_ranks(group, world)
    spans = per is not None and len({r // per for r in members}) > 1
    return machine_key_for(str(device), str(dist.get_backend(group)), per, spans)


@functools.lru_cache(maxsize=16)
def machine_key_for(device: str, backend: str, per: int | None, spans: bool
                    ) -> machine.MachineKey:
    """The key of a call on ``device`` over ``backend``, ``per`` GPUs a node, its group
    spanning nodes or not (also read before any process group exists: Megatron's run)."""
    dev = torch.device(device)
    if dev.type == "cuda":
        gpu = torch.cuda.get_device_name(dev)
        peer = torch.cuda.device_count() > 1 and torch.cuda.can_device_access_peer(0, 1)
        link = f"{backend}/{'p2p' if peer else 'no-p2p'}"
        nccl = _nccl() if backend == "nccl" else "none"
    else:
        gpu, link, nccl = dev.type, backend, "none"
    return machine.MachineKey(gpu, per, link + ("+net" if spans else ""), nccl,
                              machine.emulated_links(current().emulate))


def _nccl() -> str:
    version = torch.cuda.nccl.version()  # a tuple in recent torch, an int before
    return ".".join(map(str, version)) if isinstance(version, tuple) else str(version)


def machine_profile(group, world: int, device: torch.device, options: BurstOptions
                    ) -> tuple[Profile | None, machine.MachineKey | None]:
    """(this machine's profile if this process holds it, the key to acquire it by if not);
    (None, None) where no measured profile is wanted: a profile named, or measuring off."""
    found = current()  # a bad setting raised there, on every rank, before any message
    if options.profile or found.profile:
        return None, None
    if not found.auto_measure:
        _say_once("off", "burst auto: %s=off: deciding from the shipped profile %s, "
                  "measured on another machine", MEASURE_ENV, DEFAULT_PROFILE)
        return None, None
    key = machine_key(group, world, device)
    found = _KNOWN.get((group_name(group), key))
    return (found, None) if found is not None else (None, key)


def acquire(group, world: int, key: machine.MachineKey, q, k, v, causal: bool,
            attend) -> Profile:
    """This machine's profile, found by rank 0 or measured on every rank (module
    docstring). Every rank of ``group`` calls it together; ``attend`` is ``burst_attn``."""
    found = machine.find(key) if dist.get_rank() == consensus.root(group) else None
    told = consensus.from_root(group, None if found is None else (found[0].to_json(), found[1]))
    if told is not None:
        prof = Profile.from_json(told[0])
        logger.info("burst auto: profile %s (%s) matches this machine (%s)", told[1],
                    machine.measured_when(prof), key.describe())
    else:
        t0, took = time.perf_counter(), Phases()
        with torch.enable_grad():
            prof = _measure(group, world, key, q, k, v, causal, attend, took)
        prof = Profile.from_json(consensus.from_root(group, prof.to_json()))  # rank 0's figures
        path = _store(prof, key)
        logger.warning("burst auto: measured this machine (%s) in %.1f s at first use (%s); "
                       "cached at %s", key.describe(), time.perf_counter() - t0, took, path)
    _KNOWN[(group_name(group), key)] = prof
    return prof


def _store(prof: Profile, key: machine.MachineKey) -> str:
    try:
        return str(machine.store(prof, key))
    except OSError as e:  # measured and used, but the next run measures again: say so
        return f"nowhere ({CACHE_ENV}: {e}; the next run measures again)"


def _say_once(what: str, message: str, *args) -> None:
    if what not in _SAID:
        _SAID.add(what)
        logger.warning(message, *args)


class Phases(dict):
    """Seconds each part of a first use took, in order, for its log line (a Megatron layer's
    first use took 10.3 s on 2x H100 where a benchmark's took 3.3: it says where)."""

    def timed(self, name: str, fn, *args, **kwargs):
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            self[name] = time.perf_counter() - t0

    def __str__(self) -> str:
        return ", ".join(f"{name} {seconds:.1f} s" for name, seconds in self.items())


def _measure(group, world: int, key: machine.MachineKey, q, k, v, causal: bool,
             attend, took: Phases) -> Profile:
    """Every measurement the decision needs, at the call's sizes (this rank's figures);
    ``took``: where the seconds went."""
    device, cpu = q.device, q.device.type == "cpu"
    heads = HeadShape.of_tensors(q, k, v)
    tokens = max(q.shape[0] * q.shape[1], 1)
    per = key.gpus_per_node
    # Every topology the group allows (whatever this call fixes: the cache serves them all).
    tops = candidates(world, heads, max_intra_node_size=cluster.max_intra_node_size(
        world, cluster.GpusPerNode(per, "key"), group_ranks=group_ranks(group, world),
        rank=dist.get_rank()))
    repeat = 2 if cpu else 3
    intra, inter, a2a = took.timed("links", _links, group, world, per, tops, heads, tokens,
                                  device, repeat)
    # The kernel at the call's sizes, and across the range the cached profile will serve
    # (later calls of other sizes read it): up to the cap, so no size is extrapolated.
    cap = 512 if cpu else 32768
    sizes = sorted({min(tokens * u, cap) for u in {t.ulysses for t in tops}}
                   | {cap // 16, cap // 4, cap})
    dense, varlen = took.timed("kernels", measure.measure_kernels, sizes, q.shape[2],
                              q.shape[3], device, q.dtype, repeat, group, kv_heads=k.shape[2],
                              settle_s=0.0 if cpu else SETTLE_S)
    memory = took.timed("memory", measure.measure_memory, 2**22 if cpu else 2**28, device,
                       repeat, group)
    shape = measure.HostShape.tiny(world, device) if cpu else measure.HostShape.of_call(q, world)
    host = took.timed("host", host_fields, group, world, device, q.dtype, repeat, attend, shape)
    base = load_profile(DEFAULT_PROFILE)
    copied = [w for w, link in (("intra-node link", intra), ("inter-node link", inter),
                                ("all-to-all", a2a)) if link is None]
    source = (f"measured at first use of 'auto' on {world} rank(s), {per or world} per node "
              f"({key.describe()})" + (f"; not measured (nothing to measure on, no decision "
                                       f"needed it): the {', '.join(copied)}, copied from "
                                       f"{base.name}" if copied else ""))
    prof = Profile(name=f"measured-{key.gpu.replace(' ', '-')}", intra=intra or base.intra,
                   inter=inter or base.inter, alltoall=a2a or base.alltoall, dense=dense,
                   varlen=varlen, memory_gbps=measure.significant(memory),
                   gpus_per_node=per or world, source=source, **host)
    nodes = current().emulate
    if nodes is not None and not emulator.active():  # set, but nothing slows the links
        prof = machine.with_emulated_links(prof, nodes, real=inter or prof.intra)
    return dataclasses.replace(prof, machine=tuple(sorted(key.fields().items())),
                               measured=time.strftime("%Y-%m-%d %H:%M:%S"))


def _links(group, world: int, per: int | None, tops, heads: HeadShape, tokens: int,
           device: torch.device, repeat: int):
    """(intra, inter, all-to-all) Links at the candidates' own message sizes; None for a
    link there is nothing to measure on (one rank per node, one node, no Ulysses)."""
    members, me = group_ranks(group, world), dist.get_rank()
    nodes: dict[int, list[int]] = {}
    for r in members:
        nodes.setdefault(r // per if per else 0, []).append(r)
    uniform = len({len(m) for m in nodes.values()}) == 1
    mine = nodes[me // per if per else 0]
    local, order, cap = mine.index(me), sorted(nodes), 2**22 if device.type == "cpu" else 2**28
    hops = [b for t in tops if t.ring_size > 1
            for b in (t.hop_bytes(tokens), t.backward_hop_bytes(tokens))]
    sizes = _sizes(hops, cap)

    def fit(to: int, frm: int):
        return measure.link_of([(n, measure.hop_seconds(to, frm, n, device, repeat, group))
                                for n in sizes])

    intra = inter = a2a = None
    if sizes and uniform and len(mine) > 1:
        intra = fit(mine[(local + 1) % len(mine)], mine[(local - 1) % len(mine)])
    if sizes and uniform and len(order) > 1:
        i = order.index(me // per)
        inter = fit(nodes[order[(i + 1) % len(order)]][local],
                    nodes[order[(i - 1) % len(order)]][local])
    u = max(t.ulysses for t in tops)
    if u > 1:
        first = members.index(me) // u * u
        peers = members[first:first + u]
        one = cost.ulysses_bytes(u, tokens, heads.hq, heads.hkv, heads.head_dim,
                                 heads.elem_bytes, v_head_dim=heads.v_head_dim)[0] // 4
        a2a = measure.link_of([(n, measure.timed(measure.exchange(peers, n, device), device,
                                                 repeat, group)) for n in _sizes([one], cap)])
    return intra, inter, a2a


def _sizes(nbytes: list[int], cap: int) -> list[int]:
    """At most four of the call's message sizes (capped), and a small one for latency."""
    sizes = sorted({max(1, min(b, cap)) for b in nbytes})
    if len(sizes) > 4:
        sizes = [sizes[0], sizes[len(sizes) // 3], sizes[2 * len(sizes) // 3], sizes[-1]]
    return sorted(set(sizes) | {max(4096, sizes[0] // 16)}) if sizes else []


def host_fields(group, world: int, device: torch.device, dtype: torch.dtype, repeat: int,
                attend, shape: measure.HostShape) -> dict:
    """The profile's host fields (microseconds a ring step, a call and a Ulysses call; a new
    pack's, ``pack_fields``), from calls on the group of ``shape`` (``measure.HostShape``):
    a flat ring (one call, 2 x world steps), Ulysses over the whole group (one call, 2 steps;
    None on one rank) and new packs, all timed in turns (``measure.host_rounds``). ``tune``
    measures with it too."""
    q = shape.qkv(device, dtype, shape.tokens)
    kinds = [{}] + ([dict(ulysses_size=world)] if world > 1 else [])

    def call(kw):
        return lambda: attend(q, q, q, group, causal=True, backward="ring", **kw).sum(
        ).backward()

    packs = shape.qkv(device, dtype, shape.pack_tokens)
    fns = [call(kw) for kw in kinds] + [_new_packs(packs, group, world, docs, attend, kw)
                                         for kw in kinds for docs in PACK_DOCS]
    # a host's times are noisy: many runs, in turns
    times = measure.host_rounds(fns, device, max(repeat, HOST_REPEAT), group)
    ring = times[0]
    step, per_call, per_ulysses = 0.0, statistics.median(ring), None
    if world > 1:
        step, per_call = measure.step_and_call(ring, times[1], 2 * world - 2)
        per_ulysses = round(statistics.median(times[1]) * 1e6, 1)
    return dict(step_overhead_us=round(step * 1e6, 1), call_overhead_us=round(per_call * 1e6, 1),
                ulysses_call_overhead_us=per_ulysses,
                **pack_fields(times[len(kinds):], world))


def pack_fields(times: list[list[float]], world: int) -> dict:
    """The profile's host figures for a new document pack (``host_time.pack_seconds``), from
    the timed packs (``_new_packs``: each count of ``PACK_DOCS``, the flat ring's then
    Ulysses'): a fixed cost and one per document from the two counts' medians, for the flat
    ring and for Ulysses over the group (None on one rank)."""
    fields: dict = {}
    for n, prefix in enumerate(("", "ulysses_")):
        per_doc = fixed = None
        if world > 1 or not prefix:
            few, many = (statistics.median(t) for t in times[2 * n:2 * n + 2])
            per_doc = max(0.0, (many - few) / (PACK_DOCS[1] - PACK_DOCS[0]))
            fixed = round(max(0.0, few - PACK_DOCS[0] * per_doc) * 1e6, 1)
            per_doc = round(per_doc * 1e6, 2)
        fields.update({f"{prefix}pack_call_overhead_us": fixed,
                       f"{prefix}pack_doc_overhead_us": per_doc})
    return fields


def pack_lengths(docs: int, total: int) -> list[int]:
    """A timed pack's document lengths: ``total`` tokens in ``docs`` documents whose shares
    fall by ``PACK_DECAY`` each (at least a token each), as real data's long tail has them:
    its first documents cross ranks (the ring hops), its last ones are short. Tiny packs of
    uniform random cuts were not packs' cost: 16 such documents of a few tokens each fit
    whole on their ranks, so the ring sent nothing and read cheaper than 2 documents."""
    shares = [PACK_DECAY ** i for i in range(docs)]
    lens = [max(1, int(total * s / sum(shares))) for s in shares]
    lens[0] += total - sum(lens)
    return lens


def _new_packs(q: torch.Tensor, group, world: int, docs: int, attend, kw: dict):
    """A whole_docs call (fwd+bwd) on a new pack every run: ``pack_lengths`` in a new
    order, the same on every rank (a pack repeated is planned once: not what training
    pays)."""
    lens, draw = pack_lengths(docs, q.shape[1] * world), random.Random(docs)

    def run() -> None:
        order = draw.sample(lens, len(lens))
        cu = torch.tensor([0, *itertools.accumulate(order)], dtype=torch.int32)
        attend(q, q, q, group, causal=True, backward="ring", layout="whole_docs",
               cu_seqlens=cu, **kw).sum().backward()
    return run
