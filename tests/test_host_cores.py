"""benchmarks/host_cores.py: each CPU timed with the calling thread pinned there (and its
CPUs given back), the fastest or slowest chosen per rank, and the line a pinned table prints."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import host_cores  # noqa: E402
import slice_masks  # noqa: E402


def test_each_cpu_is_timed_pinned_and_the_thread_gets_its_cpus_back(monkeypatch):
    seen = []
    monkeypatch.setattr(host_cores, "python_ms", lambda: seen.append(os.sched_getaffinity(0))
                        or 10.0 + len(seen))
    before = os.sched_getaffinity(0)
    speeds = host_cores.core_speeds()
    assert os.sched_getaffinity(0) == before
    assert sorted(speeds) == sorted(before)
    assert seen == [{c} for c in sorted(before)]  # pinned to each in turn while timed


def test_the_fastest_or_slowest_cpus_go_to_the_ranks_in_order():
    speeds = {0: 20.0, 1: 14.0, 2: 30.0, 3: 16.0}
    assert host_cores.chosen(speeds, 2, "fast") == [1, 3]
    assert host_cores.chosen(speeds, 2, "slow") == [2, 0]
    with pytest.raises(ValueError, match="'fast' or 'slow'"):
        host_cores.chosen(speeds, 2, "quick")
    with pytest.raises(ValueError, match="a CPU per rank: 5 ranks, 4 CPUs"):
        host_cores.chosen(speeds, 5, "fast")


def test_the_python_loop_takes_time_and_repeats():
    ms = host_cores.python_ms(reps=3, loops=20_000)
    assert 0 < ms < 1_000


def test_a_pinned_table_says_where_and_an_unpinned_one_says_nothing():
    pin = dict(which="fast", cores=[5, 11], ms=[13.8, 13.84],
               every_cpu_ms={"5": 13.8, "11": 13.84, "7": 28.2})
    assert slice_masks._pinned(dict(pinned=pin)) == [
        "main threads pinned (fast): rank r on CPU [5, 11][r], 13.8 / 13.8 ms at "
        "host_cores.python_ms (every CPU: 13.8-28.2)"]
    assert slice_masks._pinned(dict(pinned=None)) == []
    assert slice_masks._pinned({}) == []


def test_each_rank_pins_to_its_cpu_of_rank_0s_timing(monkeypatch):
    """Rank 0 times the CPUs and shares them; each rank takes its own of the chosen."""
    timed, pinned = [], []
    monkeypatch.setattr(host_cores, "core_speeds", lambda: timed.append(1) or
                        {0: 20.0, 1: 14.0, 2: 30.0, 3: 16.0})
    monkeypatch.setattr(host_cores, "pin_main_thread", pinned.append)
    shared = {}
    rank0 = host_cores.pin_ranks("slow", 0, 2, lambda v: shared.setdefault("v", v))
    rank1 = host_cores.pin_ranks("slow", 1, 2, lambda v: shared["v"])
    assert timed == [1] and pinned == [2, 0]  # only rank 0 timed; the slowest two, in order
    assert rank0 == rank1 == dict(which="slow", cores=[2, 0], ms=[30.0, 20.0],
                                  every_cpu_ms={0: 20.0, 1: 14.0, 2: 30.0, 3: 16.0})
