"""This machine as the time model knows it: the key a measured profile is filed under, the
cache of measured profiles, which profile 'auto' decides from, and the emulated links.

A profile is good only for the machine it was measured on. ``MachineKey`` names that machine:
the GPU model, GPUs per node, the link kind (backend, peer access, whether the group spans
nodes), the NCCL version, and the link emulator's virtual links when
``$MEGATRON_BURST_EMULATE`` is set (an emulated network is another machine). A profile
records its key (``Profile.machine``) and when it was measured (``Profile.measured``);
``megatron-burst tune`` and the first-use measurement (``attention.first_use``) write the
same file format. A profile is picked for a machine only where every field it records
equals the machine's: a cached one (``$MEGATRON_BURST_PROFILE_CACHE``, default
``~/.cache/megatron-burst/profiles``) first, then a shipped one. A profile named by the user
(``$MEGATRON_BURST_PROFILE``, ``profile=``) is used as named, whatever its key.

``$MEGATRON_BURST_AUTO_MEASURE`` (``on``, the default, or ``off``): whether 'auto' measures
this machine at first use and checks its choice against a timed call; ``off`` decides from
the shipped default profile and says so.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import re
from pathlib import Path

from ..comm.emulated_nodes import VirtualNodes
from ..comm.settings import CACHE_ENV, MEASURE_ENV, current  # noqa: F401  (named here too)
from .timing import PROFILES_DIR, Link, Profile, load_profile

logger = logging.getLogger(__name__)


# Links are timed as the ring uses them, hops queued back to back (``measure.hop_seconds``);
# until 2026-11-27 each hop was timed alone with a sync, which added the host's round trip.
LINK_TIMING = "queued hops"


@dataclasses.dataclass(frozen=True)
class MachineKey:
    """What a profile is measured on (see the module docstring); every field a string or
    int, so the key is its own JSON."""

    gpu: str  # the device's name ("cpu" for CPU ranks)
    gpus_per_node: int | None  # None: unknown (the group is taken as one node)
    link: str  # e.g. "nccl/p2p", "nccl/p2p+net", "gloo"
    nccl: str  # the NCCL version, "none" without NCCL
    emulate: str | None = None  # the emulator's virtual links, normalised; None: off
    # How its links were timed: a profile timed another way is another measurement (the
    # cache file's name hashes this field, so one cached before is measured again).
    link_timing: str = LINK_TIMING

    def fields(self) -> dict:
        return dataclasses.asdict(self)

    def matches(self, recorded: tuple | dict) -> bool:
        """Whether a profile recording ``recorded`` was measured on this machine: every
        field it records equals ours (a profile that records none matches no machine)."""
        recorded = dict(recorded)
        if recorded:  # recorded before links were timed queued: timed one synced hop a time
            recorded.setdefault("link_timing", "one synced hop")
        mine = self.fields()
        return bool(recorded) and all(k in mine and mine[k] == v for k, v in recorded.items())

    def describe(self) -> str:
        emulate = f", emulated links {self.emulate}" if self.emulate else ""
        return (f"{self.gpu}, {self.gpus_per_node or 'unknown'} per node, link {self.link}, "
                f"NCCL {self.nccl}{emulate}")

    def file_name(self) -> str:
        text = json.dumps(self.fields(), sort_keys=True)
        slug = re.sub(r"[^A-Za-z0-9.]+", "-", f"{self.gpu}-{self.gpus_per_node}-{self.link}")
        return f"{slug.strip('-')}-{hashlib.sha256(text.encode()).hexdigest()[:12]}.json"


def emulated_links(nodes: VirtualNodes | None) -> str | None:
    """The virtual links as a key field (one spelling whatever the variable's spacing)."""
    if nodes is None:
        return None
    return (f"gpus_per_node={nodes.gpus_per_node},gbps={nodes.gbps:g},"
            f"latency_us={nodes.latency_us:g}")


def measure_on() -> bool:
    """``$MEGATRON_BURST_AUTO_MEASURE`` (``comm.settings``: read once, validated there)."""
    return current().auto_measure


def cache_dir() -> Path:
    """Where measured profiles are cached (``$MEGATRON_BURST_PROFILE_CACHE``, ``settings``)."""
    return current().profile_cache


def cache_path(key: MachineKey) -> Path:
    return cache_dir() / key.file_name()


def find(key: MachineKey) -> tuple[Profile, str] | None:
    """The profile measured on this machine and where it lies: the cached one, else a
    shipped one whose key matches; None: none (measure)."""
    path = cache_path(key)
    if path.is_file():
        try:
            prof = load_profile(str(path))
        except ValueError as e:  # a broken cache file is measured again, and said so
            logger.warning("burst auto: ignoring the unreadable cached profile %s (%s); "
                           "measuring again", path, e)
        else:
            if key.matches(prof.machine):
                return prof, str(path)
    for shipped in sorted(PROFILES_DIR.glob("*.json")):
        prof = load_profile(shipped.stem)
        if key.matches(prof.machine):
            return prof, f"shipped {shipped.stem}"
    return None


def store(prof: Profile, key: MachineKey) -> Path:
    """Write ``prof`` to this machine's cache file, atomically (ranks may write at once)."""
    path = cache_path(key)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(prof.to_json(), indent=1)
    if path.is_file() and path.read_text() == text:
        return path
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
    return path


def measured_when(prof: Profile) -> str:
    """When a profile was measured, for logs and plans."""
    return f"measured {prof.measured}" if prof.measured else "measurement date not recorded"


def with_emulated_links(prof: Profile, nodes: VirtualNodes | None,
                        real: Link | None = None) -> Profile:
    """``prof`` with its inter-node link as the emulator makes it: a message between virtual
    nodes arrives after the larger of its real transfer (``real``, default the intra-node
    link: one host) and the emulated one. A profile measured under these very links is
    returned as it is."""
    text = emulated_links(nodes)
    if text is None or dict(prof.machine).get("emulate") == text:
        return prof
    real = real or prof.intra
    sizes = sorted({int(p[0]) for p in real.points} | {2**16, 2**20, 2**24, 2**28})
    lat = nodes.latency_us * 1e-6
    points = tuple((b, float(f"{b / (max(real.seconds(b), nodes.seconds(b)) - lat) / 1e9:.4g}"))
                   for b in sizes)
    inter = Link(latency_us=nodes.latency_us, gbps=min(real.gbps, nodes.gbps), points=points)
    return dataclasses.replace(prof, inter=inter)
