"""The link emulator on CPU ranks: which messages cross a virtual node, how long they take,
that a ring hop across the boundary is slowed while one inside is not, and its switch
($MEGATRON_BURST_EMULATE): off by default, read by the benchmarks and by Megatron's entry."""
from __future__ import annotations

import argparse
import os
import pathlib
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist

from megatron_burst.comm.emulated_nodes import ENV
from megatron_burst.comm import emulator
from megatron_burst.comm.emulator import VirtualNodes

from .distributed import run_ranks


def test_parse_and_the_link_model():
    nodes = VirtualNodes.parse("gpus_per_node=2, gbps=25, latency_us=5")
    assert nodes == VirtualNodes(2, 25.0, 5.0)
    assert nodes.crosses(1, 2) and not nodes.crosses(2, 3)
    assert nodes.seconds(25_000_000) == pytest.approx(1e-3 + 5e-6)
    assert nodes.cross_bytes_alltoall(0, [0, 1, 2, 3], 100) == 200
    assert nodes.cross_bytes_ring_gather(2, [0, 1, 2, 3], 100) == 300  # 1 -> 2 crosses
    assert nodes.cross_bytes_ring_gather(1, [0, 1, 2, 3], 100) == 0
    for bad in ("gbps=25", "gpus_per_node=2,gbps=0", "gpus_per_node=2,gbps=2,speed=3", "x"):
        with pytest.raises(ValueError, match="MEGATRON_BURST_EMULATE"):
            VirtualNodes.parse(bad)


def _hop_times(rank, world):
    from megatron_burst.comm import Packed, PeerComm
    from megatron_burst.comm.emulator import Emulation

    emulation = Emulation(VirtualNodes(gpus_per_node=2, gbps=0.005, latency_us=0))  # 5 MB/s
    emulation.install()
    try:
        comm, times = PeerComm(None), []
        buf = Packed.holding([torch.ones(250_000)])  # 1 MB: 200 ms across the slow link
        for _ in range(3):
            # Together: a rank still installing would otherwise count as a slow hop.
            dist.barrier()
            recv = Packed.like(buf.views)
            t0 = time.perf_counter()
            comm.hop(buf, (rank + 1) % world, recv, (rank - 1) % world).wait()
            times.append(time.perf_counter() - t0)
        return min(times)
    finally:
        emulation.uninstall()


def test_a_hop_across_virtual_nodes_is_slowed_and_one_inside_is_not():
    times = run_ranks(4, _hop_times, timeout=120)
    # Ranks 0 and 2 receive from the other virtual node (3 -> 0, 1 -> 2): >= 200 ms.
    assert times[0] >= 0.19 and times[2] >= 0.19
    # Ranks 1 and 3 receive from their own node: fast, but they wait for nothing slow.
    assert times[1] < 0.1 and times[3] < 0.1


# The switch: $MEGATRON_BURST_EMULATE, read by the benchmarks and by Megatron's entry point.
REPO = pathlib.Path(__file__).resolve().parents[1]
SWITCH = "gpus_per_node=1,gbps=25,latency_us=5"  # every rank its own virtual node


def test_the_switch_is_off_by_default_and_wraps_nothing():
    """Unset, the entry points' call installs nothing: torch.distributed stays as it was."""
    probe = ("import torch.distributed as dist; before = dist.isend; "
             "from megatron_burst.comm.emulator import install_from_env, active; "
             "print(install_from_env(), active(), dist.isend is before)")
    env = {k: v for k, v in os.environ.items() if k != ENV}
    out = subprocess.run([sys.executable, "-c", probe], env=env, cwd=REPO, capture_output=True,
                         text=True, timeout=120, check=True).stdout
    assert out.split() == ["None", "None", "True"]


def _non_burst_megatron_args() -> argparse.Namespace:
    """Parsed options of a run without BurstAttention (a TP baseline): --cp-comm-type p2p."""
    from megatron_burst.megatron.arguments import add_burst_args

    parser = add_burst_args(argparse.ArgumentParser())
    parser.set_defaults(cp_comm_type=["p2p"], reset_attention_mask=False,
                        reset_position_ids=False)
    return parser.parse_args([])


def test_megatron_entry_configure_run_reads_the_switch(monkeypatch, capsys):
    """Both Megatron entry points call configure_run: it installs the emulator first, for
    every run (a TP baseline too), once per process, and rank 0 says so in one line."""
    pytest.importorskip("megatron.core")
    from megatron_burst.megatron import entry

    original = dist.batch_isend_irecv
    monkeypatch.delenv(ENV, raising=False)
    monkeypatch.delenv("RANK", raising=False)
    entry.configure_run(_non_burst_megatron_args(), SimpleNamespace())
    assert emulator.active() is None and dist.batch_isend_irecv is original
    assert "!!" not in capsys.readouterr().out

    monkeypatch.setenv(ENV, SWITCH)
    try:
        entry.configure_run(_non_burst_megatron_args(), SimpleNamespace())
        first = emulator.active()
        entry.configure_run(_non_burst_megatron_args(), SimpleNamespace())  # a 2nd model chunk
        assert first is not None and emulator.active() is first
        assert first.nodes == VirtualNodes(1, 25.0, 5.0)
        assert dist.batch_isend_irecv is not original
        lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("!!")]
        assert lines == [f"!! {ENV}={SWITCH}: links across emulated nodes of 1 rank slowed to "
                         f"25 GB/s (+5 us a message); timings are not real hardware"]
    finally:
        if emulator.active() is not None:
            emulator.active().uninstall()
    assert emulator.active() is None and dist.batch_isend_irecv is original


def _benchmark_start(rank, world):
    """What a benchmark's rank does first (benchmarks/ranks.py), with the switch off then on."""
    import contextlib
    import io

    sys.path.insert(0, str(REPO / "benchmarks"))
    import ranks

    seen = []
    for text in (None, SWITCH):
        if text:
            os.environ[ENV] = text
        else:
            os.environ.pop(ENV, None)
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            assert ranks.start_ranks("gloo") == (rank, world)
        seen.append((ranks.emulated(), out.getvalue()))
    emulator.active().uninstall()
    return seen


def test_benchmarks_read_the_switch_when_they_start_their_ranks():
    (off0, on0), (off1, on1) = run_ranks(2, _benchmark_start, timeout=120)
    assert off0 == (False, "") and off1 == (False, "")
    assert on0[0] and on0[1].startswith(f"!! {ENV}={SWITCH}: ") and on0[1].count("\n") == 1
    assert on1 == (True, "")  # installed on every rank, said on rank 0 only


# Every benchmark whose own ranks run it (`if __name__` and torch.distributed), not the
# helpers they import (ranks.py starts them; baselines.py holds the peers' code), nor the
# CPU-only ones (`*_cpu.py`), which spawn gloo processes of their own and emulate no links.
GPU_BENCHMARKS = sorted(p.name for p in (REPO / "benchmarks").glob("*.py")
                        if "import torch.distributed" in p.read_text()
                        and "__main__" in p.read_text() and p.name != "ranks.py"
                        and not p.stem.endswith("_cpu"))


def test_the_gpu_benchmarks_are_found():
    assert {"attention.py", "documents.py", "p2p_ring.py", "host_time.py"} <= set(GPU_BENCHMARKS)


@pytest.mark.parametrize("script", GPU_BENCHMARKS)
def test_each_gpu_benchmark_starts_its_ranks_through_the_switch(script):
    text = (REPO / "benchmarks" / script).read_text()
    assert "start_ranks()" in text and "init_process_group" not in text
