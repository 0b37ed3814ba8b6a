"""What the time model's profile is measured with: timed ring hops, all-to-alls, kernel calls
and copies, and the fits that turn them into ``timing.Link`` and ``timing.Kernel``.

One set of measurements serves both ``megatron-burst tune`` (a whole cluster, sizes from 1 MB
to 256 MB) and the first use of 'auto' (``first_use``: the call's own sizes and shapes, on the
call's group, in seconds). Every timing runs on every rank of a group together (a barrier
before each run) and is the median of ``repeat`` runs after one warm-up.
"""
from __future__ import annotations

import dataclasses
import statistics
import time
from typing import Callable, Sequence

import torch
import torch.distributed as dist

from ..decide.timing import Kernel, Link


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn: Callable[[], object], device: torch.device, repeat: int,
          group: dist.ProcessGroup | None = None) -> float:
    """Median seconds of ``fn`` over ``repeat`` runs after one warm-up, ranks in step."""
    return statistics.median(samples(fn, device, repeat, group))


def samples(fn: Callable[[], object], device: torch.device, repeat: int,
            group: dist.ProcessGroup | None = None) -> list[float]:
    """Seconds of each of ``repeat`` runs of ``fn`` after one warm-up, ranks in step, the
    GPU idle at each start, until the GPU finished."""
    return _rounds([fn], device, repeat, group, wall=True)[0]


def host_rounds(fns: Sequence[Callable[[], object]], device: torch.device, repeat: int,
                group: dist.ProcessGroup | None = None) -> list[list[float]]:
    """Seconds of each run of several calls until it returned to Python, the host's own work
    (nothing in a call waits for the GPU: a call's wall time read as its host's once took in
    a stall of the GPU's or its links', 16.5 ms a call where its rounds took 3.7-4.3 on 2x
    H100 under emulated 50 GB/s links, ``results/h100x2_issue41_host``). Taken in turns (one
    warm-up each, then ``repeat`` rounds of one run of each), so a slow spell of the host
    lands on all of them: on 2x H100 five runs in a row of one tiny pack read 3.21-3.27 ms,
    and the medians of such fives 2.89-5.63 ms from one measurement to the next
    (``results/h100x2_issue41_real_packs``)."""
    return _rounds(fns, device, repeat, group, wall=False)


def _rounds(fns: Sequence[Callable[[], object]], device: torch.device, repeat: int,
            group: dist.ProcessGroup | None, wall: bool) -> list[list[float]]:
    """Each fn once (a warm-up), then ``repeat`` rounds of one timed run of each: the GPU
    idle and the ranks in step at each start, timed until it returned (``wall``: until the
    GPU finished too)."""
    for fn in fns:
        fn()
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(repeat):
        for fn, mine in zip(fns, times):
            sync(device)
            dist.barrier(group=group)
            t0 = time.perf_counter()
            fn()
            if wall:
                sync(device)
            mine.append(time.perf_counter() - t0)
    return times


# Tokens a rank of tiny plain calls and of tiny packs (whose documents need room), and the
# most a rank of the calls the host is timed on otherwise (``HostShape.of_call``).
TINY_TOKENS, PACK_TOKENS, HOST_TOKENS = 64, 256, 8192


@dataclasses.dataclass(frozen=True)
class HostShape:
    """The calls the host is timed on: ``tokens`` a rank, ``heads`` of ``head_dim`` (q, k, v
    alike); a pack's documents in ``pack_tokens`` a rank."""

    tokens: int
    heads: int
    head_dim: int
    pack_tokens: int

    @staticmethod
    def tiny(world: int, device: torch.device) -> "HostShape":
        """Tiny calls (one head a rank, for Ulysses): CPU ranks."""
        return HostShape(TINY_TOKENS, world, 16 if device.type == "cpu" else 64, PACK_TOKENS)

    @staticmethod
    def of_call(q: torch.Tensor, world: int) -> "HostShape":
        """The call's heads and head dim, its tokens a rank up to ``HOST_TOKENS`` (a longer
        call hides its host): on 2x H100 tiny calls read 0.68-0.84 of 8K calls' host, and
        given each row's own host the model came within 15% in 31/28/32 and 32/32/32 of 32
        rows of two runs (``results/h100x2_issue41_real_packs``, ``model_replay.py
        --row-host``).
        Heads that Ulysses over the group cannot split: one a rank."""
        tokens = min(q.shape[0] * q.shape[1], HOST_TOKENS)
        heads = q.shape[2] if q.shape[2] % world == 0 else world
        return HostShape(tokens, heads, q.shape[3], max(tokens, PACK_TOKENS))

    @staticmethod
    def typical(world: int, device: torch.device) -> "HostShape":
        """Where no call gives one (``tune``): a Llama-like 32 heads (or one a rank) of 128
        at ``HOST_TOKENS`` a rank; tiny calls on CPU ranks."""
        if device.type == "cpu":
            return HostShape.tiny(world, device)
        return HostShape(HOST_TOKENS, world * max(1, 32 // world), 128, HOST_TOKENS)

    def qkv(self, device: torch.device, dtype: torch.dtype, tokens: int) -> torch.Tensor:
        """One tensor serving as q, k and v."""
        return torch.randn(1, tokens, self.heads, self.head_dim, device=device, dtype=dtype,
                           requires_grad=True)


def step_and_call(ring: Sequence[float], ulysses: Sequence[float], steps: int
                  ) -> tuple[float, float]:
    """(per ring step, per call) seconds of host work, from timed tiny calls: a flat ring's
    (``steps`` more ring steps than the other) and Ulysses' over the whole group. The step
    is their medians' difference over ``steps`` only where that difference exceeds both
    samples' spread: two tiny calls' times differ by a millisecond call to call, and first
    use once read 1,390 us a step from such noise (on 2x H100, every other run 0), which the
    model adds to every step of a document pack."""
    med_ring, med_uly = statistics.median(ring), statistics.median(ulysses)
    spread = max(max(ring) - min(ring), max(ulysses) - min(ulysses))
    step = (med_ring - med_uly) / steps if steps and med_ring - med_uly > spread else 0.0
    return step, max(0.0, med_ring - (steps + 2) * step)


# Hops a link's timing queues back to back: the ring posts each step's hop ahead of the
# compute that hides it and waits once, so a hop timed alone with a sync each priced every
# hop the host's round trip (2x H100 NVLink: 166 us of "latency" against 98.6 queued,
# ``benchmarks/results/h100x2_issue41_queued``), and the accumulator's unhidden trip home
# could not be priced with it.
QUEUED_HOPS = 4


def hop(peer_to: int, peer_from: int, nbytes: int, device: torch.device,
        queued: int = 1) -> Callable:
    """``queued`` ring hops back to back, then one wait: each sends ``nbytes`` to
    ``peer_to`` while receiving as many from ``peer_from`` (global ranks), through
    ``dist.batch_isend_irecv`` (the emulator's too)."""
    send = torch.ones(nbytes, dtype=torch.uint8, device=device)
    recv = torch.empty_like(send)  # one buffer for all: the hops land one after the other

    def run() -> None:
        works = []
        for _ in range(queued):
            ops = [dist.P2POp(dist.isend, send, peer_to),
                   dist.P2POp(dist.irecv, recv, peer_from)]
            works += dist.batch_isend_irecv(ops)
        for work in works:
            work.wait()
    return run


def hop_seconds(peer_to: int, peer_from: int, nbytes: int, device: torch.device,
                repeat: int, group: dist.ProcessGroup | None = None) -> float:
    """Seconds of one ring hop of ``nbytes`` as the ring pays it: ``QUEUED_HOPS`` queued
    hops timed together (``timed``), over their number."""
    run = hop(peer_to, peer_from, nbytes, device, QUEUED_HOPS)
    return timed(run, device, repeat, group) / QUEUED_HOPS


def exchange(peers: Sequence[int], nbytes: int, device: torch.device) -> Callable:
    """An all-to-all among ``peers`` (global ranks, this rank among them) as one batch of
    point-to-point messages, as the Ulysses split posts it: ``nbytes`` leave this rank."""
    me = dist.get_rank()
    others = [p for p in peers if p != me]
    piece = max(1, nbytes // max(len(others), 1))
    sends = {p: torch.ones(piece, dtype=torch.uint8, device=device) for p in others}
    recvs = {p: torch.empty(piece, dtype=torch.uint8, device=device) for p in others}

    def run() -> None:
        ops = [dist.P2POp(dist.isend, sends[p], p) for p in others] + [
            dist.P2POp(dist.irecv, recvs[p], p) for p in others]
        for work in dist.batch_isend_irecv(ops):
            work.wait()
    return run


def significant(value: float) -> float:
    """Four significant digits, not two decimals: a slow link or kernel (CPU ranks on a busy
    host) must not round to 0, which the time model would divide by (and refuses)."""
    return float(f"{value:.4g}")


def link_of(points: list[tuple[int, float]]) -> Link:
    """A Link from (bytes, seconds) points: bandwidth per size, latency from the smallest."""
    pts = sorted(points)
    bw = [(b, b / t / 1e9) for b, t in pts]
    # Latency: what the smallest message costs beyond its bytes at the largest bandwidth.
    latency = max(0.0, pts[0][1] - pts[0][0] / (bw[-1][1] * 1e9)) * 1e6
    return Link(latency_us=round(latency, 2), gbps=significant(bw[-1][1]),
                points=tuple((b, significant(g)) for b, g in bw))


def fit_kernel(points: list[tuple[int, float]]) -> Kernel:
    """The measured (n, TFLOP/s) points, which the model interpolates, with the least
    squares of 1/rate = 1/peak + (half/peak) / n over them (what a profile says in two
    numbers; the model extrapolates nothing from it where it has points)."""
    pts = tuple((n, significant(r)) for n, r in sorted(points))
    return dataclasses.replace(_fit(points), points=pts)


def _fit(points: list[tuple[int, float]]) -> Kernel:
    xs, ys = [1.0 / n for n, _ in points], [1.0 / r for _, r in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    var = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / var if var else 0.0
    intercept = my - slope * mx
    if intercept <= 0 or not var:  # still rising at the largest size, or one size only
        return Kernel(significant(max(r for _, r in points)), 0.0)
    return Kernel(significant(1.0 / intercept), round(max(0.0, slope / intercept), 1))


def measure_kernels(tokens: Sequence[int], heads: int, head_dim: int, device: torch.device,
                    dtype: torch.dtype, repeat: int, group: dist.ProcessGroup | None = None,
                    kv_heads: int | None = None, settle_s: float = 0.0) -> tuple[Kernel, Kernel]:
    """(dense, varlen) fwd+bwd rates of this rank's local kernel on causal blocks of each
    of ``tokens`` (varlen: the same tokens as 8 documents in one call, and at the largest
    size as 2 too).

    ``settle_s``: seconds of back-to-back calls at the largest size first. A GPU that sat
    idle runs its first calls at its highest clock; under training's sustained load an
    H100 settles 5-12% slower (1980 against 1500-1700 MHz at 700 W,
    ``benchmarks/sustained_rate.py``), and the model predicts training."""
    from ..kernels.selection import select_kernel
    from ..plan.schedule import Block

    dense, varlen = [], []
    for n in sorted(tokens, reverse=settle_s > 0):  # the largest first: it settles the clock
        # Drawn on the device: drawing 32K tokens' tensors on the host took seconds of
        # first use, and the GPU's clock climbed back while it sat idle between sizes.
        gen = torch.Generator(device=device).manual_seed(n)
        q, do = (torch.randn(1, n, heads, head_dim, generator=gen, device=device, dtype=dtype)
                 for _ in range(2))
        k, v = (torch.randn(1, n, kv_heads or heads, head_dim, generator=gen, device=device,
                            dtype=dtype) for _ in range(2))
        kern, scale = select_kernel(q, k), head_dim ** -0.5
        blk = Block(0, n, 0, n, "causal")

        def dense_step():
            out, lse = kern.forward(q, k, v, blk, scale)
            kern.backward(do, q, k, v, out, lse, blk, scale)

        flops = 3.5 * 4 * n * n / 2 * heads * head_dim
        _busy(dense_step, device, settle_s if not dense else 0.0)
        dense.append((n, flops / timed(dense_step, device, repeat, group) / 1e12))
        # Documents of n/8 tokens at every size, and of n/2 at the largest: a document
        # longer than the longest measured was priced at that one's rate (on 2x H100 4K
        # tokens at 274 TFLOP/s, the dense kernel 512 at 8K), and a pack's long documents
        # carry most of its work.
        for docs in (8, 2) if n == max(tokens) else (8,):
            varlen.append((n // docs, flops / docs / timed(
                _varlen_step(kern, q, k, v, do, n, docs, scale), device, repeat, group) / 1e12))
    return fit_kernel(dense), fit_kernel(varlen)


def _varlen_step(kern, q, k, v, do, n: int, docs: int, scale: float) -> Callable[[], None]:
    """One varlen fwd+bwd over ``docs`` causal documents of n/docs tokens each."""
    from ..kernels.varlen import plan_calls
    from ..plan.schedule import Block

    size = n // docs
    # Not coalesced: this times the varlen kernel, and documents of one token are one band.
    (call,) = plan_calls([Block(i * size, (i + 1) * size, i * size, (i + 1) * size, "causal")
                          for i in range(docs)], varlen=True, dense_min_area=float("inf"),
                         coalesce=False)

    def step() -> None:
        out, lse = kern.forward_varlen(q[0], k[0], v[0], call, scale)
        kern.backward_varlen(do[0], q[0], k[0], v[0], out, lse, call, scale)
    return step


def _busy(step: Callable[[], object], device: torch.device, seconds: float) -> None:
    """``step()`` back to back for ``seconds`` (its clock settled to a sustained load)."""
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        step()
        sync(device)


def measure_memory(nbytes: int, device: torch.device, repeat: int,
                   group: dist.ProcessGroup | None = None) -> float:
    """GB/s of a copy of ``nbytes`` (read and write)."""
    src = torch.ones(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    return 2 * nbytes / timed(lambda: dst.copy_(src), device, repeat, group) / 1e9
