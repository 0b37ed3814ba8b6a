"""Start a torchrun benchmark's ranks: the process group, this rank's GPU, the link emulator.

attention.py, documents.py and p2p_ring.py call `start_ranks()` first. With
``$MEGATRON_BURST_EMULATE`` set (``gpus_per_node=2,gbps=25[,latency_us=5]``, see
`megatron_burst.comm.emulator`), messages between virtual nodes are slowed from then on and
rank 0 prints one line saying so; unset (the default), nothing is emulated. `emulated()`
says which, so that methods whose traffic the emulator cannot slow (PyTorch's native CP)
stay out, and `EMULATE_ENV` is the variable a result file records. The Megatron benchmarks
(megatron_e2e.py and those built on it) need nothing here: their ranks run the package's
entry point, whose `configure_run` reads the same variable. `host_and_wall_ms` is the
host-time benchmarks' clock: the ranks aligned, the host's share and the GPU's wall.
`ran_package` is the folder of the package a run imported, for its result file: a
before-and-after pair on two trees (``$PYTHONPATH``) shows there which tree each side timed.
`write_run` writes a run's ``OUT.json`` (meta and rows) and ``OUT.md`` (its table), and
`finish_run` does it at a family benchmark's end from `family_run_meta`'s record;
`family_options` are the options of the benchmarks that time mask families one by one.
`spawn_cpu_ranks` starts a ``--cpu-smoke`` run's gloo ranks without torchrun.
`gpu_health` is each GPU's temperature, SM clock and active clock-event reasons, for a result
file's meta before and after its run: a machine whose GPU ran hot timed the backward 3-4x
slow (``results/h100x2_issue42_throttled``), and a result should say it was not one.
"""
from __future__ import annotations

import datetime
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from typing import Callable

import torch
import torch.distributed as dist

from megatron_burst.comm.emulated_nodes import ENV as EMULATE_ENV
from megatron_burst.comm.emulator import active, install_from_env

__all__ = ["EMULATE_ENV", "emulated", "family_options", "family_run_meta", "finish_run",
           "gpu_health", "host_and_wall_ms", "ran_package", "spawn_cpu_ranks", "start_ranks",
           "write_run"]

_HEALTH = ("index", "temperature.gpu", "clocks.sm", "clocks_event_reasons.active")


def start_ranks(backend: str = "nccl") -> tuple[int, int]:
    """(rank, world) after initialising the process group (unless it is already), setting
    this rank's GPU (nccl) and installing the link emulator where the variable asks."""
    if not dist.is_initialized():
        dist.init_process_group(backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    install_from_env()
    return rank, world


def spawn_cpu_ranks(world: int) -> None:
    """This script again as ``world`` gloo ranks on this machine (a ``--cpu-smoke`` run
    without torchrun), on a port the system says is free: a port derived from the pid
    could be one another run of the test suite holds. Raises SystemExit naming the ranks'
    exit codes when one fails."""
    import socket
    import sys

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
               WORLD_SIZE=str(world))
    procs = [subprocess.Popen([sys.executable, *sys.argv],
                              env=dict(env, RANK=str(r), LOCAL_RANK=str(r)))
             for r in range(world)]
    codes = [p.wait() for p in procs]
    if any(codes):
        raise SystemExit(f"--cpu-smoke ranks exited with {codes}")


def ran_package() -> str:
    """The folder of the ``megatron_burst`` this process imported."""
    import megatron_burst

    return os.path.dirname(os.path.abspath(megatron_burst.__file__))


def gpu_health() -> list[dict] | None:
    """Each GPU's index, temperature (C), SM clock (MHz) and active clock-event reasons (a
    bit mask in hex: thermal and power slowdowns among them), as ``nvidia-smi`` reads them;
    None where there is no ``nvidia-smi`` or it fails."""
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        done = subprocess.run(["nvidia-smi", f"--query-gpu={','.join(_HEALTH)}",
                               "--format=csv,noheader,nounits"], capture_output=True,
                              text=True, timeout=20, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    rows = [[x.strip() for x in line.split(",")] for line in done.stdout.splitlines()
            if line.strip()]
    return [dict(index=int(r[0]), temperature_c=float(r[1]), sm_mhz=float(r[2]),
                 clock_events=r[3]) for r in rows if len(r) == len(_HEALTH)]


def family_options(parser, families: str) -> None:
    """``--out``, ``--families`` (default ``families``), ``--tokens`` (per GPU), ``--warmup``
    and ``--iters``: what host_parts.py and gpu_timeline.py take alike."""
    parser.add_argument("--out", required=True, help="path prefix: writes OUT.json and OUT.md")
    parser.add_argument("--families", default=families)
    parser.add_argument("--tokens", type=int, default=8192, help="tokens per GPU")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--iters", type=int, default=20)


def write_run(out: str, meta: dict, rows: list, text: str) -> None:
    """``out``.json (``meta`` and ``rows``) and ``out``.md (``text``, the run's table), the
    folder made where it is missing."""
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out + ".json", "w") as f:
        json.dump(dict(meta=meta, rows=rows), f, indent=1)
    with open(out + ".md", "w") as f:
        f.write(text + "\n")


def family_run_meta(args, world: int, dev: torch.device, health: list | None, **extra) -> dict:
    """A family benchmark's record, on rank 0 at the end of its run: the device, its GPUs'
    ``health`` before the run and now, world, torch, tokens per GPU, warm-up and timed calls,
    the package it ran, the date and the command as given (``extra``: its own fields)."""
    return dict(device=torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
                gpus_before=health, gpus_after=gpu_health(), world=world,
                torch=torch.__version__, tokens_per_gpu=args.tokens, warmup=args.warmup,
                iters=args.iters, package=ran_package(), **extra,
                date=datetime.date.today().isoformat(), command=" ".join(sys.argv))


def finish_run(rank: int, out: str, meta: Callable[[], dict], rows: list,
               table: Callable[[dict, list], str]) -> None:
    """Rank 0 prints the run's ``table`` of its ``meta()`` and ``rows`` and writes them
    (``write_run``); then every rank leaves together (no rank ends while rank 0 writes)."""
    if rank == 0:
        record = meta()
        text = table(record, rows)
        print(text)
        write_run(out, record, rows, text)
    dist.barrier()
    dist.destroy_process_group()


def emulated() -> bool:
    """Whether this process's links between virtual nodes are emulated."""
    return active() is not None


def host_and_wall_ms(fn, iters: int) -> tuple[float, float]:
    """Median ms until ``fn()`` returned (the host) and until the GPU finished (the wall),
    the ranks aligned before each call."""
    host, wall = [], []
    for _ in range(iters):
        torch.cuda.synchronize()
        dist.barrier()
        t0 = time.perf_counter()
        fn()
        host.append((time.perf_counter() - t0) * 1e3)
        torch.cuda.synchronize()
        wall.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(host), statistics.median(wall)
