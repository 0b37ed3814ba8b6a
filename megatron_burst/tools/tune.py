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
- a large copy (memory bandwidth) and the host's cost per ring step, per call, per Ulysses
  call and per new document pack, from burst_attn on calls of a typical shape (32 heads of
  128, 8K tokens a rank; tiny on CPU), as first use measures them.
On CPU (gloo) it runs the same measurements at toy sizes, which is how the tests check it.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from typing import Sequence

import torch
import torch.distributed as dist

from ..attention import first_use, measure as measuring
from ..attention.measure import measure_kernels, measure_memory
from ..decide import machine
from ..decide.timing import Link, Profile, load_profile


UNMEASURED = "; not measured"  # in a profile's source, before the links it copied
# The measurements themselves live with the call path, which measures at first use too.
_timed, _hop_seconds, _link = measuring.timed, measuring.hop_seconds, measuring.link_of
_fit_kernel = measuring.fit_kernel


def measure_links(sizes: Sequence[int], gpus_per_node: int, device: torch.device,
                  repeat: int) -> tuple[Link | None, Link | None, Link | None]:
    """(intra, inter, all-to-all) from this rank's point of view; None for a link there
    is nothing to measure on (one rank per node, one node, one rank)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    node, local = divmod(rank, gpus_per_node)
    nodes = world // gpus_per_node
    first = node * gpus_per_node  # this node's first rank
    intra = [(n, _hop_seconds(first + (local + 1) % gpus_per_node,
                              first + (local - 1) % gpus_per_node, n, device, repeat))
             for n in sizes] if gpus_per_node > 1 else []
    inter = [(n, _hop_seconds((node + 1) % nodes * gpus_per_node + local,
                              (node - 1) % nodes * gpus_per_node + local, n, device, repeat))
             for n in sizes] if nodes > 1 else []
    a2a = []
    for n in sizes:
        x = torch.ones(n // world * world, dtype=torch.uint8, device=device)
        y = torch.empty_like(x)
        t = _timed(lambda: dist.all_to_all_single(y, x), device, repeat)
        a2a.append((n * (world - 1) // world, t))  # bytes that leave the rank
    return (_link(intra) if intra else None, _link(inter) if inter else None,
            _link(a2a) if world > 1 else None)


def measure_overheads(device: torch.device, dtype: torch.dtype, repeat: int) -> dict:
    """The profile's host fields (microseconds a ring step, a call, a Ulysses call and a new
    pack's), as first use measures them (``first_use.host_fields``: calls over the whole
    group, timed until they return), so a tuned profile and a measured one price the host
    alike; with no call to take a shape from, a typical one (``HostShape.typical``)."""
    import megatron_burst as mb

    world = dist.get_world_size()
    return first_use.host_fields(None, world, device, dtype, repeat, mb.burst_attn,
                                 measuring.HostShape.typical(world, device))


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
    host = measure_overheads(device, dtype, repeat)
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
    key = dataclasses.replace(first_use.machine_key(None, world, device),
                              gpus_per_node=gpus_per_node)
    profile = Profile(name=name, intra=intra, inter=inter, alltoall=a2a, dense=dense,
                      varlen=varlen, memory_gbps=measuring.significant(memory),
                      gpus_per_node=gpus_per_node, source=source, **host,
                      machine=tuple(sorted(key.fields().items())),
                      measured=time.strftime("%Y-%m-%d %H:%M:%S"))
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
    parser.add_argument("--cache", action="store_true",
                        help="also file the profile in this machine's profile cache "
                             "($MEGATRON_BURST_PROFILE_CACHE), where 'auto' finds it")
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
            if args.cache:
                prof = Profile.from_json(result["profile"])
                print(f"filed as {machine.store(prof, machine.MachineKey(**dict(prof.machine)))}")
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

