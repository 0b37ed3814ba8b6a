"""``megatron-burst tune``: measure a cluster once, write the profile the time model reads.

    torchrun --nproc-per-node 8 -m megatron_burst.tools.tune --out profile.json  # one node
    srun ... torchrun --nnodes N ... -m megatron_burst.tools.tune --out profile.json  # several

It measures, on the ranks it is started on (under a minute on GPUs):
- ring hops of 1-256 MB to the next rank of the node (intra) and to the same local rank of
  the next node (inter); a link there is nothing to measure on (one node; one rank per
  node; one rank, for the all-to-all) is copied from the base profile, and the file's
  source and a note on stderr say it was not measured;
- all-to-all among the ranks of a node;
- the local attention kernel's fwd+bwd rate at a few block sizes, dense and varlen, fitted
  to ``peak * n / (n + n_half)``;
- a large copy (memory bandwidth) and the host's cost per ring step and per call, from
  burst_attn on tiny inputs.
On CPU (gloo) it runs the same measurements at toy sizes, which is how the tests check it.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Callable, Sequence

import torch
import torch.distributed as dist

from ..decide.timing import Kernel, Link, Profile, load_profile


UNMEASURED = "; not measured"  # in a profile's source, before the links it copied


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(fn: Callable[[], object], device: torch.device, repeat: int) -> float:
    """Median seconds of ``fn`` over ``repeat`` runs after one warm-up, ranks in step."""
    fn()
    times = []
    for _ in range(repeat):
        _sync(device)
        dist.barrier()
        t0 = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _hop(peer_to: int, peer_from: int, nbytes: int, device: torch.device) -> Callable:
    send = torch.ones(nbytes, dtype=torch.uint8, device=device)
    recv = torch.empty_like(send)

    def hop() -> None:
        ops = [dist.P2POp(dist.isend, send, peer_to), dist.P2POp(dist.irecv, recv, peer_from)]
        for work in dist.batch_isend_irecv(ops):
            work.wait()
    return hop


def _link(points: list[tuple[int, float]]) -> Link:
    """A Link from (bytes, seconds) points: bandwidth per size, latency from the smallest."""
    pts = sorted(points)
    bw = [(b, b / t / 1e9) for b, t in pts]
    # Latency: what the smallest message costs beyond its bytes at the largest bandwidth.
    latency = max(0.0, pts[0][1] - pts[0][0] / (bw[-1][1] * 1e9)) * 1e6
    # Four significant digits, not two decimals: a slow link (CPU ranks on a busy host)
    # must not round to 0 GB/s, which the time model would divide by (and refuses).
    return Link(latency_us=round(latency, 2), gbps=_significant(bw[-1][1]),
                points=tuple((b, _significant(g)) for b, g in bw))


def _significant(value: float) -> float:
    return float(f"{value:.4g}")


def measure_links(sizes: Sequence[int], gpus_per_node: int, device: torch.device,
                  repeat: int) -> tuple[Link | None, Link | None, Link | None]:
    """(intra, inter, all-to-all) from this rank's point of view; None for a link there
    is nothing to measure on (one rank per node, one node, one rank)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    node, local = divmod(rank, gpus_per_node)
    nodes = world // gpus_per_node
    first = node * gpus_per_node  # this node's first rank
    intra = [(n, _timed(_hop(first + (local + 1) % gpus_per_node,
                             first + (local - 1) % gpus_per_node, n, device), device, repeat))
             for n in sizes] if gpus_per_node > 1 else []
    inter = [(n, _timed(_hop((node + 1) % nodes * gpus_per_node + local,
                             (node - 1) % nodes * gpus_per_node + local, n, device),
                        device, repeat)) for n in sizes] if nodes > 1 else []
    a2a = []
    for n in sizes:
        x = torch.ones(n // world * world, dtype=torch.uint8, device=device)
        y = torch.empty_like(x)
        t = _timed(lambda: dist.all_to_all_single(y, x), device, repeat)
        a2a.append((n * (world - 1) // world, t))  # bytes that leave the rank
    return (_link(intra) if intra else None, _link(inter) if inter else None,
            _link(a2a) if world > 1 else None)


def _fit_kernel(points: list[tuple[int, float]]) -> Kernel:
    """Least squares of 1/rate = 1/peak + (half/peak) / n over the measured (n, TFLOP/s)."""
    xs, ys = [1.0 / n for n, _ in points], [1.0 / r for _, r in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    var = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / var if var else 0.0
    intercept = my - slope * mx
    # Significant digits, not decimals: a slow CPU's peak (0.004 TFLOP/s) must not round to
    # 0, which the time model would divide by (and refuses), as for the links.
    if intercept <= 0:  # still rising at the largest size: no saturation seen
        return Kernel(_significant(max(r for _, r in points)), 0.0)
    return Kernel(_significant(1.0 / intercept), round(max(0.0, slope / intercept), 1))


def measure_kernels(tokens: Sequence[int], heads: int, head_dim: int, device: torch.device,
                    dtype: torch.dtype, repeat: int) -> tuple[Kernel, Kernel]:
    """(dense, varlen) fwd+bwd rates of this rank's local kernel on causal blocks."""
    from ..kernels.selection import select_kernel
    from ..plan.schedule import Block
    from ..kernels.varlen import plan_calls

    dense, varlen = [], []
    for n in tokens:
        gen = torch.Generator(device="cpu").manual_seed(n)
        q, k, v, do = (torch.randn(1, n, heads, head_dim, generator=gen).to(device, dtype)
                       for _ in range(4))
        kern, scale = select_kernel(q, k), head_dim ** -0.5
        blk = Block(0, n, 0, n, "causal")

        def dense_step():
            out, lse = kern.forward(q, k, v, blk, scale)
            kern.backward(do, q, k, v, out, lse, blk, scale)

        flops = 3.5 * 4 * n * n / 2 * heads * head_dim
        dense.append((n, flops / _timed(dense_step, device, repeat) / 1e12))
        docs = 8  # the same tokens as 8 documents in one varlen call
        (call,) = plan_calls([Block(i * n // docs, (i + 1) * n // docs, i * n // docs,
                                    (i + 1) * n // docs, "causal") for i in range(docs)],
                             varlen=True, dense_min_area=float("inf"))

        def varlen_step():
            out, lse = kern.forward_varlen(q[0], k[0], v[0], call, scale)
            kern.backward_varlen(do[0], q[0], k[0], v[0], out, lse, call, scale)

        varlen.append((n // docs, flops / docs / _timed(varlen_step, device, repeat) / 1e12))
    return _fit_kernel(dense), _fit_kernel(varlen)


def measure_memory(nbytes: int, device: torch.device, repeat: int) -> float:
    src = torch.ones(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    return 2 * nbytes / _timed(lambda: dst.copy_(src), device, repeat) / 1e9


def measure_overheads(device: torch.device, dtype: torch.dtype, repeat: int
                      ) -> tuple[float, float]:
    """(per ring step, per call) host microseconds: burst_attn on inputs too small for the
    kernel or the links to matter, over the whole group and on one rank alone."""
    import megatron_burst as mb

    world = dist.get_world_size()
    q = torch.randn(1, 128, 2, 64, device=device, dtype=dtype, requires_grad=True)

    def ring_call():
        mb.burst_attn(q, q, q, causal=True).sum().backward()

    ring_s = _timed(ring_call, device, repeat)
    # A group of one rank each (every rank creates every group, as new_group requires).
    groups = [dist.new_group([r]) for r in range(world)] if world > 1 else [None]
    one = groups[dist.get_rank()]

    def local_call():
        mb.burst_attn(q, q, q, one, causal=True).sum().backward()

    call_s = statistics.median(_timed(local_call, device, 1) for _ in range(repeat))
    steps = 2 * world  # forward and backward each walk the ring's world steps
    return max(0.0, (ring_s - call_s) / steps) * 1e6, call_s * 1e6


def measure(*, gpus_per_node: int | None = None, quick: bool = False,
            base: str | None = None) -> tuple[Profile, dict]:
    """Run every measurement on the initialised process group; (profile, raw numbers).

    Every rank must call it. ``base``: the profile whose inter-node link is kept when
    there is only one node.
    """
    device = (torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available()
              else torch.device("cpu"))
    cpu = device.type == "cpu"
    dtype = torch.float32 if cpu else torch.bfloat16
    world = dist.get_world_size()
    gpus_per_node = gpus_per_node or int(os.environ.get("LOCAL_WORLD_SIZE", world))
    repeat = 3 if (quick or cpu) else 10
    sizes = [2**16, 2**20] if cpu else [2**20, 2**24, 2**26, 2**28]
    tokens = [256, 1024] if cpu else [2048, 8192, 32768]
    heads, head_dim = (2, 32) if cpu else (32, 128)
    intra, inter, a2a = measure_links(sizes, gpus_per_node, device, repeat)
    dense, varlen = measure_kernels(tokens, heads, head_dim, device, dtype, repeat)
    memory = measure_memory(2**24 if cpu else 2**30, device, repeat)
    step_us, call_us = measure_overheads(device, dtype, repeat)
    base_profile = load_profile(base)
    name = f"tuned-{'cpu' if cpu else torch.cuda.get_device_name(device).replace(' ', '-')}"
    source = (f"measured by megatron-burst tune on {world} rank(s), {gpus_per_node} per node, "
              f"{time.strftime('%Y-%m-%d')}")
    links = {"intra-node link": intra, "inter-node link": inter, "all-to-all": a2a}
    unmeasured = [what for what, link in links.items() if link is None]
    intra = intra or base_profile.intra
    inter = inter or base_profile.inter
    a2a = a2a or base_profile.alltoall
    if unmeasured:
        source += (f"{UNMEASURED} on {world} rank(s), {gpus_per_node} per node: the "
                   f"{', '.join(unmeasured)} (copied from {base_profile.name})")
    profile = Profile(name=name, intra=intra, inter=inter, alltoall=a2a, dense=dense,
                      varlen=varlen, memory_gbps=round(memory, 1),
                      step_overhead_us=round(step_us, 1), call_overhead_us=round(call_us, 1),
                      gpus_per_node=gpus_per_node, source=source)
    raw = dict(world=world, gpus_per_node=gpus_per_node, device=str(device), sizes=sizes,
               tokens=tokens)
    return profile, raw


def _agree(value: dict) -> dict:
    """Rank 0's measurements, the same on every rank (ranks differ by noise)."""
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def raw_path(out: str) -> str:
    """Where the raw measurements go: beside the profile, as NAME.raw.json."""
    return os.path.splitext(out)[0] + ".raw.json"


def check_outputs(out: str, force: bool) -> None:
    """Refuse (OutputError, one line) a profile path that cannot be written as asked, before
    anything is measured: see ``launch.output_files``."""
    from ..launch.output_files import check_output_file

    check_output_file(out, "--out", force)
    check_output_file(raw_path(out), "--out (its raw measurements)", force)


def _write(out: str, result: dict, force: bool) -> None:
    from ..launch.output_files import write_output_file

    write_output_file(raw_path(out), json.dumps(result, indent=1), "--out", force)
    write_output_file(out, json.dumps(result["profile"], indent=1), "--out", force)


def _problem_on_rank_0(out: str, force: bool) -> str | None:
    """Rank 0's verdict on the outputs (only it writes them), the same on every rank, so
    either every rank measures or none does."""
    problem = None
    if dist.get_rank() == 0:
        try:
            check_outputs(out, force)
        except ValueError as e:
            problem = str(e)
    box = [problem]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="megatron-burst tune", description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, help="where to write the profile (JSON)")
    parser.add_argument("--quick", action="store_true", help="fewer repeats")
    parser.add_argument("--force", action="store_true",
                        help="replace the profile and its .raw.json if they exist")
    parser.add_argument("--base", default=None,
                        help="profile whose inter-node link is kept on one node (default: "
                             "$MEGATRON_BURST_PROFILE or h200-nvlink)")
    args = parser.parse_args(argv)
    own_group = not dist.is_initialized()
    if own_group:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        if torch.cuda.is_available():
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        dist.init_process_group(backend)
    problem = _problem_on_rank_0(args.out, args.force)
    if problem is None:
        t0 = time.time()
        profile, raw = measure(quick=args.quick, base=args.base)
        result = _agree(dict(profile=profile.to_json(), raw=raw,
                             seconds=round(time.time() - t0, 1)))
        if dist.get_rank() == 0:
            _write(args.out, result, args.force)
            print(f"wrote {args.out} ({result['seconds']} s): " + json.dumps(result["profile"]))
            source = result["profile"]["source"]
            if UNMEASURED in source:
                print(f"note: {UNMEASURED[2:]}{source.split(UNMEASURED)[1]}: run tune on 2 or more "
                      f"ranks of a node, on 2 nodes for the inter-node link", file=sys.stderr)
    elif dist.get_rank() == 0:
        print(f"megatron-burst tune: {problem}", file=sys.stderr)
    if own_group:
        dist.destroy_process_group()
    return 0 if problem is None else 2


if __name__ == "__main__":
    raise SystemExit(main())

