"""Spawn a small gloo process group on this machine and run a function on every rank.

Tests run many cases inside one spawn, because starting ranks (importing torch in each)
costs seconds while a small case costs milliseconds. A rank that raises, or a group that
does not finish within ``timeout`` seconds (a hang), fails the test with every rank's
traceback, and the processes are killed so nothing lingers.
"""
from __future__ import annotations

import os
import queue as queue_mod
import shutil
import tempfile
import traceback

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _worker(rank, world, store, backend, fn, args, results, barrier):
    try:
        torch.set_num_threads(1)
        if backend == "nccl":
            torch.cuda.set_device(rank)
        # A file store: no port to pick, so no other process can take it first.
        dist.init_process_group(backend, init_method=f"file://{store}", rank=rank,
                                world_size=world)
        out = fn(rank, world, *args)
        if barrier:
            dist.barrier()
        results.put((rank, "ok", out))
    except BaseException:  # report everything, including assertion errors, to the parent
        results.put((rank, "error", traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def run_ranks(world: int, fn, *args, timeout: float = 600.0, backend: str = "gloo",
              barrier: bool = True) -> list:
    """Run ``fn(rank, world, *args)`` on ``world`` ranks; return the results by rank.

    ``backend="nccl"`` gives rank r GPU r. ``barrier=False`` skips the closing barrier, for
    tests that break the group on purpose (a timed-out gloo wait closes its connections).
    """
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    folder = tempfile.mkdtemp(prefix="burst-ranks-")
    procs = [ctx.Process(target=_worker, args=(r, world, os.path.join(folder, "store"), backend,
                                               fn, args, results, barrier), daemon=True)
             for r in range(world)]
    for p in procs:
        p.start()
    got, errors = {}, []
    try:
        for _ in range(world):
            rank, status, payload = results.get(timeout=timeout)
            if status == "ok":
                got[rank] = payload
            else:
                errors.append(f"rank {rank}:\n{payload}")
    except queue_mod.Empty:
        errors.append(f"timed out after {timeout}s (a hang?); finished ranks: {sorted(got)}")
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
        shutil.rmtree(folder, ignore_errors=True)
    if errors:
        raise AssertionError("\n".join(errors))
    return [got[r] for r in range(world)]
