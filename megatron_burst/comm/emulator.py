"""A two-tier network on one host, for benchmarks: slow down what crosses a virtual node.

Every GPU this project can borrow sits on one NVLink host, where a flat ring and a double
ring measure the same. Multi-node clusters have a ~10x slower link between nodes. This
module makes one host behave like ``nodes`` x ``gpus_per_node`` GPUs: a message between
ranks of different virtual nodes arrives no earlier than ``latency_us + bytes / gbps`` after
the stream that posts it reaches the post (after the slow link's earlier messages). It is
NEVER on by default: ``MEGATRON_BURST_EMULATE="gpus_per_node=2,gbps=25,
latency_us=5"`` turns it on in ``install_from_env()``, which the benchmarks call
(``benchmarks/ranks.py``) and both Megatron entry points call (from ``configure_run``,
``megatron.burst_run``). Unset, it installs nothing and wraps nothing. It installs
once per process, and rank 0 prints one line saying every timing is emulated.

How, so that compute and overlap behave as on a real cluster: the torch.distributed calls
the ring, Ulysses, all-gather and Megatron's TP collectives use are wrapped. When a message
that crosses a virtual node is posted, a GPU sleep of the emulated transfer time is queued
on a side stream of its own (one per direction, so successive transfers queue as on one
link), behind the work the posting stream had queued (until 2026-11-26 it was not: the
sleep began when the host posted, often long before the data existed, so emulated runs
measured faster than the links allow), and whoever waits for the message also waits for
that sleep. The real transfer runs
at NVLink speed in parallel, so arrival is max(real, emulated). The compute stream never
runs the sleep. On CPU (gloo) the wait sleeps the remaining time instead.

PyTorch's native context parallelism calls functional collectives that are not wrapped:
its cross-node traffic is not slowed, so benchmarks leave it out under emulation.
"""
from __future__ import annotations

import sys
import time
from typing import Any, Callable

import torch
import torch.distributed as dist

from . import settings
from .emulated_nodes import ENV, VirtualNodes

_ACTIVE: Emulation | None = None  # what install_from_env installed in this process


class _Link:
    """The side stream (or, on CPU, the clock) that models one direction of the slow link."""

    def __init__(self, device: torch.device):
        self.device = device
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self.free_at = 0.0  # CPU: when the link's last transfer ends
        self._cycles_per_s = _clock_rate(device) if device.type == "cuda" else 0.0

    def occupy(self, seconds: float) -> Any:
        """Queue a transfer of ``seconds``; returns what a waiter must wait for."""
        if self.stream is None:
            self.free_at = max(self.free_at, time.monotonic()) + seconds
            return self.free_at
        # The transfer starts when its data is ready, where the posting stream gets to the
        # post (NCCL's own streams wait for it too), not when the host posts it: the host
        # runs ahead of the GPU, and a sleep started then would hide behind earlier work.
        self.stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.stream):
            torch.cuda._sleep(max(1, int(seconds * self._cycles_per_s)))
            done = torch.cuda.Event()
            done.record()
        return done

    @staticmethod
    def wait(token: Any) -> None:
        if isinstance(token, float):
            time.sleep(max(0.0, token - time.monotonic()))
        else:
            torch.cuda.current_stream().wait_event(token)


def _clock_rate(device: torch.device) -> float:
    """Cycles per second of ``torch.cuda._sleep``, measured once (clocks vary by GPU)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(1000)  # warm
    start.record()
    torch.cuda._sleep(10_000_000)
    end.record()
    end.synchronize()
    return 10_000_000 / (start.elapsed_time(end) / 1e3)


class _DelayedWork:
    """A work whose wait() also waits for the emulated transfer."""

    def __init__(self, work: Any, token: Any):
        self._work, self._token = work, token

    def wait(self, *args: Any, **kwargs: Any) -> Any:
        result = self._work.wait(*args, **kwargs)
        _Link.wait(self._token)
        return result

    def __getattr__(self, name: str) -> Any:
        return getattr(self._work, name)


class Emulation:
    """The wrappers around torch.distributed, installed by ``install``."""

    def __init__(self, nodes: VirtualNodes):
        self.nodes = nodes
        self._links: dict = {}
        self._originals: dict[str, Callable] = {}

    def _link(self, device: torch.device) -> _Link:
        if str(device) not in self._links:
            self._links[str(device)] = _Link(device)
        return self._links[str(device)]

    def batch_isend_irecv(self, ops: list) -> list:
        works = self._originals["batch_isend_irecv"](ops)
        me = dist.get_rank()
        slow = [op for op in ops if op.op is dist.irecv and self.nodes.crosses(me, op.peer)]
        if not slow:
            return works
        nbytes = sum(op.tensor.numel() * op.tensor.element_size() for op in slow)
        token = self._link(slow[0].tensor.device).occupy(self.nodes.seconds(nbytes))
        return [_DelayedWork(w, token) for w in works]

    def _collective(self, name: str, cross_bytes: Callable[..., int]) -> Callable:
        original = self._originals[name]

        def wrapped(out, inp, *args, group=None, async_op=False, **kwargs):
            work = original(out, inp, *args, group=group, async_op=async_op, **kwargs)
            ranks = dist.get_process_group_ranks(group or dist.group.WORLD)
            nbytes = cross_bytes(dist.get_rank(), ranks, out, inp)
            if not nbytes:
                return work
            token = self._link(out.device).occupy(self.nodes.seconds(nbytes))
            if async_op:
                return _DelayedWork(work, token)
            _Link.wait(token)
            return work
        return wrapped

    def install(self) -> None:
        _INSTALLED.append(self)
        n = self.nodes
        for name in ("batch_isend_irecv", "all_to_all_single", "all_gather_into_tensor",
                     "reduce_scatter_tensor"):
            self._originals[name] = getattr(dist, name)
        self._rebind("batch_isend_irecv", self.batch_isend_irecv)
        self._rebind("all_to_all_single", self._collective(
            "all_to_all_single", lambda me, rk, o, i: n.cross_bytes_alltoall(
                me, rk, o.numel() * o.element_size() // len(rk))))
        self._rebind("all_gather_into_tensor", self._collective(
            "all_gather_into_tensor", lambda me, rk, o, i: n.cross_bytes_ring_gather(
                me, rk, i.numel() * i.element_size())))
        self._rebind("reduce_scatter_tensor", self._collective(
            "reduce_scatter_tensor", lambda me, rk, o, i: n.cross_bytes_ring_gather(
                me, rk, o.numel() * o.element_size())))

    def _rebind(self, name: str, replacement: Callable) -> None:
        """Replace torch.distributed's ``name`` wherever it was imported by name too
        (Megatron keeps ``dist_all_gather_func = torch.distributed.all_gather_into_tensor``)."""
        original = self._originals[name]
        self._undo = getattr(self, "_undo", [])
        for module in list(sys.modules.values()):
            for attr, value in list(getattr(module, "__dict__", {}).items()):
                if value is original:
                    setattr(module, attr, replacement)
                    self._undo.append((module, attr, original))

    def uninstall(self) -> None:
        global _ACTIVE
        for module, attr, original in getattr(self, "_undo", []):
            setattr(module, attr, original)
        self._undo = []
        _INSTALLED[:] = [e for e in _INSTALLED if e is not self]
        if _ACTIVE is self:
            _ACTIVE = None


_INSTALLED: list[Emulation] = []  # every emulation whose wrappers are in place


def wraps_p2p() -> bool:
    """Whether an emulation wraps ``dist.batch_isend_irecv`` now: the ring must then post
    through it (``messages.post_ops``), not around it."""
    return bool(_INSTALLED)


def active() -> Emulation | None:
    """The emulation ``install_from_env`` installed in this process, None if none is on."""
    return _ACTIVE


def install_from_env() -> Emulation | None:
    """Install the emulated network if ``$MEGATRON_BURST_EMULATE`` is set; say so loudly.

    Installs once per process (a second call returns the first emulation: wrapping twice
    would slow every message twice); rank 0 prints one line. None when the variable is unset.
    An entry point calls it as its run starts: the package's settings are read afresh here.
    """
    global _ACTIVE
    if _ACTIVE is not None:
        return _ACTIVE
    found = settings.reload()
    nodes, text = found.emulate, found.emulate_text
    if nodes is None:
        return None
    emulation = Emulation(nodes)
    emulation.install()
    _ACTIVE = emulation
    rank = dist.get_rank() if dist.is_initialized() else found.launcher_rank
    if rank == 0:
        ranks = f"{nodes.gpus_per_node} rank{'s' if nodes.gpus_per_node > 1 else ''}"
        print(f"!! {ENV}={text}: links across emulated nodes of {ranks} slowed to "
              f"{nodes.gbps:g} GB/s (+{nodes.latency_us:g} us a message); timings are not "
              f"real hardware", flush=True)
    return emulation
