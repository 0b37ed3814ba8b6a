"""The time model: what a context-parallel topology costs in seconds, from a measured profile.

``cost.py`` counts bytes; choosing a topology needs seconds, because a byte on NVLink is not a
byte on InfiniBand, and at short lengths the ring waits on the links or on the host, not
on the kernel. A ``Profile`` holds what ``megatron-burst tune`` measures on a cluster:

- links: time of one message of b bytes = latency + b / bandwidth, per link kind (``intra``:
  inside a node, ``inter``: between nodes), fitted over 1-256 MB ring hops;
- the all-to-all of the Ulysses split, fitted the same way;
- the attention kernel: achieved fwd+bwd TFLOP/s for a block of n tokens (small blocks do
  not fill the GPU), dense and varlen, measured points or ``peak * n / (n + n_half)``;
- memory bandwidth (the fp32 merges and accumulators are memory-bound passes);
- the host's fixed cost per ring step and per call (launches, Python, NCCL bookkeeping).

``predict`` turns (CPTopology, tokens per rank, mask) into seconds per attention call, fwd+bwd,
step by step: a step costs the larger of its compute and its hop; the host's work and the
GPU's overlap, imperfectly, and a pack's host does more (``host_time``).
Its FLOPs count QK^T at Q/K's head dim and PV at V's (MLA: 192 and 128), its bytes each
tensor at its own dim (``cost``); attention sinks add no byte and one logit per row.
Every step of a causal or full layer does the same work (a document pack: ``pack_load``);
a sliding window's do not: ``scheduled_time`` predicts those step by step. ``choose`` ranks
every topology a group allows, fastest first; ``options.resolve`` takes its first. Shipped
profiles: ``h200-nvlink`` (this project's 4x H200) and ``a100-ib`` (published figures).
"""
from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
from pathlib import Path
from typing import Any, Callable, Iterable

from . import cost
from .host_time import host_seconds, overlapped
from .rates import Kernel, Link, check_profile_numbers, with_points
from .topology import CPTopology, HeadShape, TopologyError, heads_split
from ..comm.settings import PROFILE_ENV, current  # noqa: F401  (PROFILE_ENV: named here too)

DEFAULT_PROFILE = "h200-nvlink"
PROFILES_DIR = Path(__file__).parents[1] / "profiles"  # megatron_burst/profiles
# A fwd+bwd attention call as forward passes: the forward, and a backward of 2.5 (it
# recomputes the scores and computes three products).
FWD_BWD_PASSES = 3.5


@dataclasses.dataclass(frozen=True)
class Profile:
    """What the time model knows about a cluster (see the module docstring)."""

    name: str
    intra: Link
    inter: Link
    alltoall: Link
    dense: Kernel
    varlen: Kernel
    memory_gbps: float
    step_overhead_us: float
    call_overhead_us: float
    gpus_per_node: int = 8
    # The host's cost per call of Ulysses over the group (first use times it beside the flat
    # ring's; None: not measured, ``call_overhead_us`` stands in). Its two all-to-alls and
    # their copies cost the host 1.5-2x a ring call (``benchmarks/host_kinds.py``).
    ulysses_call_overhead_us: float | None = None
    # A new document pack's call, until it returns: a fixed cost and one per document, of the
    # flat ring and of Ulysses over the group (first use times packs of 4 and 16 documents
    # with a long tail, ``first_use.pack_fields``; None: not measured, ``host_time.PACK_HOST``
    # times a plain call's).
    pack_call_overhead_us: float | None = None
    pack_doc_overhead_us: float | None = None
    ulysses_pack_call_overhead_us: float | None = None
    ulysses_pack_doc_overhead_us: float | None = None
    source: str = ""  # how the numbers were obtained (measured where, or from which figures)
    # What it was measured on (``machine.MachineKey``'s fields, sorted pairs; empty: not
    # recorded, so never picked for a machine by itself) and when (ISO date and time).
    machine: tuple = ()
    measured: str = ""

    def __hash__(self) -> int:
        """By value, as the dataclass's own, but computed once: every new document pack's
        decision hashes its profile in three caches' keys (``options.decide``)."""
        cached = self.__dict__.get("_hash")
        if cached is None:
            cached = hash(tuple(getattr(self, f.name) for f in dataclasses.fields(self)))
            object.__setattr__(self, "_hash", cached)
        return cached

    def __getstate__(self) -> dict:
        """Pickled without the cached hash: another process hashes its strings otherwise."""
        return {k: v for k, v in self.__dict__.items() if k != "_hash"}

    def to_json(self) -> dict:
        return {**dataclasses.asdict(self), "machine": dict(self.machine)}

    @staticmethod
    def from_json(raw: dict) -> "Profile":
        check_profile_numbers(raw)
        links = {k: with_points(Link, raw[k]) for k in ("intra", "inter", "alltoall")}
        kernels = {k: with_points(Kernel, raw[k]) for k in ("dense", "varlen")}
        rest = {k: raw[k] for k in raw if k not in links and k not in kernels}
        machine = rest.pop("machine", None) or {}
        if not isinstance(machine, dict):
            raise ValueError(f"'machine' must be an object, got {machine!r}")
        return Profile(**links, **kernels, **rest, machine=tuple(sorted(
            (str(k), v) for k, v in machine.items())))


def load_profile(name_or_path: str | None = None) -> Profile:
    """A shipped profile by name, or a JSON file ``megatron-burst tune`` wrote. None:
    ``$MEGATRON_BURST_PROFILE`` if set, else ``h200-nvlink``. Read again whenever the file
    changes (the cache is keyed by ``profile_key``)."""
    return _load_profile(*profile_key(name_or_path))


def profile_key(name_or_path: str | None = None) -> tuple[str, int | None, int | None]:
    """What a profile's content is known by: its name or path with the file's modification
    time and size, so a profile rewritten by ``tune`` is never served from a cache."""
    name = name_or_path or current().profile or DEFAULT_PROFILE
    try:
        st = os.stat(_profile_path(name))
    except OSError:
        return name, None, None
    return name, st.st_mtime_ns, st.st_size


@functools.lru_cache(maxsize=64)  # asked at every new document pack's decision: made once
def _profile_path(name: str) -> Path:
    return PROFILES_DIR / f"{name}.json" if not Path(name).suffix else Path(name)


@functools.lru_cache(maxsize=8)
def _load_profile(name: str, mtime_ns: int | None, size: int | None) -> Profile:
    path = _profile_path(name)
    if not path.is_file():
        shipped = sorted(p.stem for p in PROFILES_DIR.glob("*.json"))
        raise ValueError(f"profile {name!r}: no such file, and not one of the shipped "
                         f"profiles {shipped}")
    try:
        return Profile.from_json(json.loads(path.read_text()))
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"profile {path}: not a megatron-burst profile ({e})") from None


# ------------------------------------------------------------------------- prediction


@dataclasses.dataclass(frozen=True)
class Prediction:
    """Seconds of one attention call (fwd+bwd) and where they go."""

    topology: CPTopology
    total_s: float
    compute_s: float
    exposed_comm_s: float
    alltoall_s: float
    host_s: float

    @property
    def serial_s(self) -> float:
        """The call's parts one after the other: its share of a training step, whose host
        thread also launches the rest of every layer (the planner's step time adds these;
        ``total_s`` is the call alone, its host running ahead of the GPU)."""
        return self.compute_s + self.exposed_comm_s + self.alltoall_s + self.host_s

    def describe(self) -> str:
        ms = 1e3
        return (f"{self.topology.describe()}: {self.total_s * ms:.2f} ms fwd+bwd predicted "
                f"(compute {self.compute_s * ms:.2f}, exposed ring {self.exposed_comm_s * ms:.2f}, "
                f"all-to-all {self.alltoall_s * ms:.2f}, host {self.host_s * ms:.2f})")


def predict(topology: CPTopology, prof: Profile, *, tokens: int, causal: bool = True,
            max_intra_node_size: int | None = None) -> Prediction:
    """Seconds per call for ``tokens`` tokens per rank (batch x local sequence).
    ``max_intra_node_size``: ranks of the group per node (None: all); hops that cross nodes
    use the inter-node link. A document pack: ``scheduled_time.predict_pack``."""
    h = topology.heads
    hq = topology.ring_heads[0]
    ring, member = topology.ring_size, tokens * topology.ulysses
    vis = 0.5 if causal else 1.0
    max_intra_node_size = max_intra_node_size or topology.cp
    # Attention work of one member: its share of the whole N x N (masked) score matrix.
    flops = attention_flops(member * member * ring * vis, hq, h.head_dim, h.v_head_dim)
    compute = flops / (prof.dense.tflops(member) * 1e12)
    host = host_seconds(topology, prof, 2 * ring)
    exposed = 0.0
    if ring > 1:
        step_fwd = compute / FWD_BWD_PASSES / ring
        step_bwd = compute * (FWD_BWD_PASSES - 1) / FWD_BWD_PASSES / ring
        exposed = (_ring_exposed(topology, prof, max_intra_node_size, step_fwd,
                                 topology.hop_bytes(tokens))
                   + _backward_exposed(topology, prof, max_intra_node_size, step_bwd, tokens))
    a2a, elementwise = alltoall_seconds(topology, prof, tokens, max_intra_node_size), \
        elementwise_seconds(topology, prof, tokens)
    total = overlapped(compute + elementwise + exposed + a2a, host)
    return Prediction(topology, total, compute + elementwise, exposed, a2a, host)


def attention_flops(pairs: float, hq: int, head_dim: int, v_head_dim: int | None = None, *,
                    passes: float = FWD_BWD_PASSES) -> float:
    """FLOPs over ``pairs`` visible (query, key) pairs per head: QK^T at Q/K's head dim, PV
    at V's (MLA: 192, 128), ``passes`` forward passes' worth (sinks: one logit a row)."""
    dv = head_dim if v_head_dim is None else v_head_dim
    return passes * 2 * (head_dim + dv) * pairs * hq


def elementwise_seconds(topology: CPTopology, prof: Profile, tokens: int) -> float:
    """The fp32 accumulators' memory passes per call: ~3 over out/lse (V's head dim)
    forward, ~9 over dq/dk/dv (Q/K's) backward. The burst backward adds its delta,
    rowsum(dO * O) in fp32 (28 bytes an element of Q: both cast, multiplied, summed), and
    each visiting step's surrogate O' (6: a norm over dO, and dO scaled); measured on 2x
    H100 the burst backward ran 0.4 ms (8K tokens a GPU) and 1.6 ms (32K) behind the ring
    backward with 32:32 heads, where both send as many bytes (these bytes price 0.41 and
    1.64; ``benchmarks/results/h100x2_issue41_interleaved/``)."""
    h = topology.heads
    hq, member = topology.ring_heads[0], tokens * topology.ulysses
    nbytes = member * hq * (3 * h.v_head_dim + 9 * h.head_dim) * 4
    if topology.backward == "burst" and topology.ring_size > 1:
        nbytes += member * hq * h.head_dim * (28 + 6 * (topology.ring_size - 1))
    return nbytes / (prof.memory_gbps * 1e9)


def alltoall_seconds(topology: CPTopology, prof: Profile, tokens: int,
                     max_intra_node_size: int | None = None) -> float:
    """Seconds of the Ulysses all-to-alls of one call (0 without Ulysses); over the
    inter-node link where a Ulysses group spans nodes."""
    h = topology.heads
    if topology.ulysses == 1:
        return 0.0
    a2a_fwd, a2a_bwd = cost.ulysses_bytes(topology.ulysses, tokens, h.hq, h.hkv, h.head_dim,
                                          h.elem_bytes, v_head_dim=h.v_head_dim)
    link = prof.inter if topology.ulysses > (max_intra_node_size or topology.cp) else prof.alltoall
    # Each all-to-all spreads its bytes over U-1 peers at once: 2 in forward (Q, K and V in
    # one; the output back), 2 in backward (dO in; dQ, dK and dV in one).
    return 4 * link.latency_us * 1e-6 + (a2a_fwd + a2a_bwd) / (link.gbps * 1e9)


def _backward_exposed(topology: CPTopology, prof: Profile, max_intra_node_size: int,
                      step_s: float, tokens: int) -> float:
    """Seconds the backward ring waits on its links. A step's payload hop is posted ahead of
    its compute, but a travelling gradient accumulator leaves only after the compute that
    adds to it: of the ring-1 it sends, ring-2 ride beside a later step's payload and the
    last comes home after the last compute, with nothing left to hide it (unpriced, it left
    the 8K-a-GPU causal rows on 2x H100 at 1.15-1.18 of their predictions:
    ``benchmarks/results/h100x2_issue41_new_packs/d_4d2299b``)."""
    ring = topology.ring_size
    payload, acc = topology.backward_hop_parts(tokens)
    riding = payload + acc * (ring - 2) // (ring - 1)
    within = ring <= max(1, max_intra_node_size // topology.ulysses)
    home = (prof.intra if within else prof.inter).seconds(acc)
    return _ring_exposed(topology, prof, max_intra_node_size, step_s, riding) + home


def _ring_exposed(topology: CPTopology, prof: Profile, max_intra_node_size: int,
                  step_s: float, hop_bytes: int) -> float:
    """Seconds the ring waits on its links over one pass of ring-1 hops."""
    ring = topology.ring_size
    positions_per_node = max(1, max_intra_node_size // topology.ulysses)
    if ring <= positions_per_node:  # the whole ring inside one node
        return (ring - 1) * max(0.0, prof.intra.seconds(hop_bytes) - step_s)
    if not topology.double:  # a flat ring across nodes: every step waits for the slowest hop
        return (ring - 1) * max(0.0, prof.inter.seconds(hop_bytes) - step_s)
    inner = topology.positions_per_node  # the double ring: one inter-node hop per round
    rounds = topology.outer_ring
    intra = (inner - 1) * rounds * max(0.0, prof.intra.seconds(hop_bytes) - step_s)
    inter = (rounds - 1) * max(0.0, prof.inter.seconds(hop_bytes) - inner * step_s)
    return intra + inter


# ------------------------------------------------------------------------- choice


def candidates(cp: int, heads: HeadShape, *, max_intra_node_size: int | None = None,
               ulysses: int | str = "auto", intra_node_size: int | None | str = "auto",
               backward: str = "auto") -> list[CPTopology]:
    """Every topology the group allows, within what the caller fixed."""
    max_intra_node_size = max_intra_node_size or cp
    sizes = [u for u in range(1, cp + 1) if cp % u == 0] if ulysses == "auto" else [ulysses]
    modes = ("burst", "ring") if backward == "auto" else (backward,)
    out = []
    for u in sizes:
        if not heads_split(heads, u):
            continue
        # A Ulysses group may span nodes: its all-to-all then runs on the inter-node link
        # (``alltoall_seconds``), and the model weighs it like any other. Ruled out by hand,
        # it cost 1.23x on two GPUs with emulated 25 GB/s links (issue 41: Ulysses 2 ran 8K
        # MHA causal in 14.7 ms, the best ring in 17.9).
        if intra_node_size == "auto":  # the flat ring, and the double ring that fills a node
            double = max_intra_node_size < cp and max_intra_node_size % u == 0
            rings: Iterable = {None, max_intra_node_size if double else None}
        elif intra_node_size is not None and intra_node_size % u:
            continue  # a double ring's node holds whole Ulysses groups
        else:
            rings = [intra_node_size]
        for r in rings:  # one member (Ulysses over the group): no backward to choose
            for mode in modes if cp // u > 1 else modes[-1:]:
                out.append(CPTopology.build(cp, ulysses=u, intra_node_size=r, backward=mode,
                                          heads=heads))
    return list(dict.fromkeys(out))


def choose(cp: int, heads: HeadShape, *, tokens: int, causal: bool = True,
           prof: Profile | None = None, max_intra_node_size: int | None = None,
           price: Callable[[CPTopology], Prediction] | None = None,
           **fixed: Any) -> list[Prediction]:
    """All candidates ranked fastest first (ties: fewer bytes, then the plain ring).
    ``price``: a candidate's prediction where ``predict`` is not it (a document pack)."""
    prof = prof or load_profile()
    preds = [price(c) if price else predict(c, prof, tokens=tokens, causal=causal,
                                           max_intra_node_size=max_intra_node_size)
             for c in candidates(cp, heads, max_intra_node_size=max_intra_node_size, **fixed)]
    if not preds:
        # Only heads that do not split leave none ('auto' always has Ulysses 1).
        setting = "num_query_groups" if fixed.get("ulysses", "auto") == "auto" else "ulysses_size"
        raise TopologyError(setting, f"no context-parallel topology fits cp={cp} with heads "
                            f"{heads} and {fixed}")
    return sorted(preds, key=lambda p: (round(p.total_s, 6), p.topology.ulysses,
                                        sum(p.topology.call_bytes(tokens)), p.topology.double))
