"""The in-process A/B benchmarks' CPU-side parts (their runs need CUDA and two GPUs):
``ab_rounds``' order and summary, ``split_ab``'s ways, ``thread_ab``'s placements and
spinners, ``host_neighbours``' idle load, the automatic kernel's lone-block knob, and
``deal_scan``'s deals and slower-rank figures."""
from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
ab_rounds = pytest.importorskip("ab_rounds")


def test_every_way_leads_and_follows_each_other_way_alike():
    names = ["a", "b", "c"]
    orders = [ab_rounds.way_order(names, r) for r in range(2 * len(names))]
    assert all(sorted(o) == names for o in orders)
    # Each way leads a round twice in two laps, and follows each other way equally often.
    assert {n: sum(o[0] == n for o in orders) for n in names} == {n: 2 for n in names}
    follows = {}
    for o in orders:
        for x, y in zip(o, o[1:]):
            follows[(x, y)] = follows.get((x, y), 0) + 1
    assert len(set(follows.values())) == 1 and len(follows) == 6


def test_the_summary_is_the_median_of_per_round_ratios():
    times = {"base": {"fwd": [1.0, 2.0, 4.0]}, "new": {"fwd": [0.9, 2.0, 2.0]}}
    got = ab_rounds.summary(times)
    assert got["base"]["fwd"] == dict(ms=2.0, ratio=1.0)
    # ratios 0.9, 1.0, 0.5: their median, not the ratio of the medians (2.0 / 2.0)
    assert got["new"]["fwd"] == dict(ms=2.0, ratio=0.9)
    times["new"]["fwd"] = [0.5, 1.0, 3.0]  # ratios 0.5, 0.5, 0.75
    assert ab_rounds.summary(times)["new"]["fwd"]["ratio"] == 0.5


def test_no_round_is_a_refusal_naming_the_call():
    with pytest.raises(ValueError, match="timed_rounds: rounds must be at least 1"):
        ab_rounds.timed_rounds({"a": lambda: None}, {}, 0)


def test_split_ways_by_name_or_by_numbers():
    split_ab = pytest.importorskip("split_ab")
    assert split_ab.parse_ways("2M,8M lone,2M/1M") == {
        "2M": (2.0 ** 21, 0.0, None), "8M lone": (2.0 ** 23, 2.0 ** 23, None),
        "2M/1M": (2.0 ** 21, 0.0, 2.0 ** 20)}
    assert split_ab.parse_ways("1e6:0") == {"1e6:0": (1e6, 0.0, None)}
    assert split_ab.parse_ways("1e6:0:5e5") == {"1e6:0:5e5": (1e6, 0.0, 5e5)}
    for bad in ("big", "1:2:3:4"):
        with pytest.raises(ValueError, match=f"--ways: '{bad}' is neither"):
            split_ab.parse_ways(f"2M,{bad}")


def test_placements_need_a_core_per_rank_and_two_more():
    thread_ab = pytest.importorskip("thread_ab")
    cores = thread_ab.physical_cores()
    assert sorted(c for core in cores for c in core) == sorted(os.sched_getaffinity(0))
    world = len(cores) - 1
    with pytest.raises(ValueError, match=f"thread_ab: {world} ranks need {world + 2}"):
        thread_ab.placements(world, 0)
    if len(cores) >= 4:
        main, every, reserved = thread_ab.placements(2, 1)
        assert main == cores[2][0] and reserved == set(cores[1]) | set(cores[2])
        assert reserved < every


def test_a_spinner_runs_until_stopped_and_dies_with_its_parent():
    thread_ab = pytest.importorskip("thread_ab")
    cpu = sorted(os.sched_getaffinity(0))[-1]
    thread_ab.spin(True, [cpu])
    try:
        (proc,) = thread_ab._SPINNING
        assert proc.poll() is None
        thread_ab.spin(True, [cpu])  # already spinning: nothing more started
        assert len(thread_ab._SPINNING) == 1
    finally:
        thread_ab.spin(False, [])
    assert thread_ab._SPINNING == [] and proc.poll() is not None
    assert "getppid() == parent" in thread_ab.SPIN  # ends once its rank is gone


def test_idle_load_covers_every_cpu_in_percent():
    host_neighbours = pytest.importorskip("host_neighbours")
    load = host_neighbours.idle_load(0.2)
    assert set(load) >= set(os.sched_getaffinity(0))
    assert all(0 <= v["busy"] <= 100 and 0 <= v["steal"] <= 100 for v in load.values())


def test_a_lone_block_below_the_knob_goes_to_the_band_kernel():
    from megatron_burst.kernels.selection import LONE_BAND_AREA, BandDispatch
    from megatron_burst.kernels.reference import ReferenceAttention
    from megatron_burst.plan.schedule import Block

    dense, band = ReferenceAttention(), ReferenceAttention()
    kernel = BandDispatch(dense, band)
    block = Block(0, 512, 0, 512, "full")
    assert LONE_BAND_AREA == 0.0 and kernel._pick(block) is dense  # off: measured, no gain
    kernel.lone_band_area = block.area + 1
    assert kernel._pick(block) is band


def test_the_table_text_heads_its_rows_with_the_run():
    text = ab_rounds.table_text(dict(device="GPU", date="2026-11-28", shape="8K", command="c"),
                                2, ("a", "b"), [(1, "x"), (2, "y")])
    assert text.splitlines() == ["GPU x2, 2026-11-28, 8K", "command: `c`", "", "| a | b |",
                                 "|---|---|", "| 1 | x |", "| 2 | y |"]


@pytest.mark.parametrize("script", ["launch_ab.py", "split_ab.py", "thread_ab.py", "pieces_ab.py",
                                    "in_place_ab.py"])
def test_a_count_below_one_is_refused_before_any_rank_starts(script):
    import subprocess

    path = Path(__file__).resolve().parents[1] / "benchmarks" / script
    got = subprocess.run([sys.executable, str(path), "--out", "/tmp/never", "--calls", "0"],
                         capture_output=True, text=True, timeout=120)
    assert got.returncode == 2 and "--calls must be at least 1, got 0" in got.stderr


def test_the_in_place_ways_switch_only_admitted_kernels():
    """``in_place_ab``'s ways turn the form on only where the probe admitted the kernel."""
    in_place_ab = pytest.importorskip("in_place_ab")
    from megatron_burst.kernels import selection
    from megatron_burst.kernels.reference import ReferenceAttention

    admitted, refused = (selection.BandDispatch(ReferenceAttention(), ReferenceAttention())
                         for _ in range(2))
    admitted.varlen_in_place = True
    before = dict(selection._CHECKED)
    selection._CHECKED.update({("t", 1): admitted, ("t", 2): refused})
    try:
        found = in_place_ab.dispatches()
        assert found[("t", 1)] is admitted and found[("t", 2)] is refused
        in_place_ab.set_way("packed")
        assert not admitted.varlen_in_place and not refused.varlen_in_place
        in_place_ab.set_way("in place")
        assert admitted.varlen_in_place and not refused.varlen_in_place
    finally:
        in_place_ab.ADMITTED.clear()
        selection._CHECKED.clear()
        selection._CHECKED.update(before)


def test_a_new_dense_threshold_drops_the_plans_and_prepared_calls():
    """``split_ab.set_split``: a prepared call holds its plan, so a way that changes the
    threshold must drop them (the lone rule, read at each call, needs nothing)."""
    split_ab = pytest.importorskip("split_ab")
    from megatron_burst.attention import call_plan, prepare
    from megatron_burst.kernels import thresholds
    from megatron_burst.kernels.reference import ReferenceAttention
    from megatron_burst.kernels.selection import BandDispatch
    from megatron_burst.kernels.thresholds import forward_min_area

    kernel = BandDispatch(ReferenceAttention(), ReferenceAttention())
    kernel.dense_min_area = 2.0 ** 21
    prepare.PREPARED["probe"] = object()
    try:
        assert not split_ab.set_split(kernel, 2.0 ** 21, 5.0)
        assert kernel.lone_band_area == 5.0 and "probe" in prepare.PREPARED
        assert split_ab.set_split(kernel, 2.0 ** 20, 0.0)
        assert kernel.dense_min_area == 2.0 ** 20 and not prepare.PREPARED
        assert not call_plan._PLANS
        prepare.PREPARED["probe"] = object()
        assert split_ab.set_split(kernel, 2.0 ** 20, 0.0, 2.0 ** 19)  # the second threshold
        assert kernel.gpu_bound_min_area == 2.0 ** 19 and not prepare.PREPARED
        # A way's first threshold is the forward's at every size, a large call's included.
        prepare.PREPARED["probe"] = object()
        assert split_ab.set_split(kernel, 2.0 ** 20, 0.0, 2.0 ** 19, math.inf)
        assert forward_min_area(kernel, 1 << 26) == 2.0 ** 20 and not prepare.PREPARED
        prepare.PREPARED["probe"] = object()
        assert split_ab.set_split(kernel, 2.0 ** 20, 0.0, 2.0 ** 19, split_ab.PACKAGE_LINE)
        assert forward_min_area(kernel, 1 << 26) == 2.0 ** 19 and not prepare.PREPARED
        assert forward_min_area(kernel, 1 << 24) == 2.0 ** 20  # at the line: the host's
    finally:
        prepare.PREPARED.pop("probe", None)
        thresholds.HOST_BOUND_MAX_ELEMENTS = split_ab.PACKAGE_LINE


def test_a_two_way_forward_reads_the_second_way_against_the_first():
    times = {"a": {"forward": [2.0, 4.0, 3.0]}, "b": {"forward": [1.0, 3.0, 3.0]}}
    got = ab_rounds.two_way_forward(times)
    assert got["ms"] == {"a": 3.0, "b": 3.0} and got["times"]["b"] == [1.0, 3.0, 3.0]
    assert got["ratio"] == 0.75  # the median of 0.5, 0.75 and 1.0


def test_deals_split_the_chunks_evenly_with_chunk_0_on_rank_0():
    deal_scan = pytest.importorskip("deal_scan")
    every = deal_scan.deals(2, 64, 4, most=100)
    assert len(every) == 35  # C(7, 3)
    for label, (mine, other) in every.items():
        assert mine[0] == (0, 16) and len(mine) == len(other) == 4
        assert sorted(mine + other) == [(16 * c, 16) for c in range(8)]
        assert label == ",".join(str(s // 16) for s, _ in mine)
    assert len(deal_scan.deals(2, 64, 8, most=10)) == 10  # sampled, seeded
    assert deal_scan.deals(2, 64, 8, most=10) == deal_scan.deals(2, 64, 8, most=10)
    with pytest.raises(ValueError, match="--chunks must divide 64"):
        deal_scan.deals(2, 64, 5, most=10)


def test_a_deal_places_the_mask_until_the_package_s_is_back():
    deal_scan = pytest.importorskip("deal_scan")
    from megatron_burst.plan import mask_families as mf
    from megatron_burst.plan.mask_placement import mask_placement

    mask = mf.family("causal_document", (20, 30, 14))
    own = [s.split for s in mask_placement("area", 2, 64, mask)]
    try:
        deal_scan.set_deal(deal_scan.deals(2, 32, 2, most=10)["0,1"])
        first = mask_placement("area", 2, 64, mask)
        assert [s.pos for s in first[0]] == [0] and first[0].length == 32
    finally:
        deal_scan.set_deal(None)
    assert [s.split for s in mask_placement("area", 2, 64, mask)] == own != [
        s.split for s in first]


def test_a_deal_s_time_is_the_slower_rank_s_round_by_round():
    deal_scan = pytest.importorskip("deal_scan")
    rows = [{"family": "f", "rank": 0, "times": {"package": {"fwd": [1.0, 2.0, 2.0]},
                                                 "0,1": {"fwd": [0.5, 0.5, 0.5]}}},
            {"family": "f", "rank": 1, "times": {"package": {"fwd": [2.0, 1.0, 2.0]},
                                                 "0,1": {"fwd": [3.0, 1.0, 1.0]}}}]
    got = deal_scan.slowest(rows)["f"]
    assert got["package"]["fwd"] == (2.0, 1.0)
    assert got["0,1"]["fwd"] == (1.0, 0.5)  # per round 3/2, 1/2, 1/2


def test_deals_in_a_layer_are_timed_round_by_round_in_the_rotated_order():
    """``deal_scan.layer_rounds`` (``--in-layer``): every deal each round, in
    ``way_order``'s order, checked before its spans are taken; the figures in
    ``timed_rounds``' form, so the slower-rank table reads them alike."""
    deal_scan = pytest.importorskip("deal_scan")
    log, current = [], []
    ways = {w: (lambda w=w: current.append(w)) for w in ("package", "0,1", "0,2")}
    spans = iter(dict(fwd_ms=float(i), bwd_ms=10.0) for i in range(1, 10))

    def measure():
        log.append(("spans", current[-1]))
        return next(spans)
    times = deal_scan.layer_rounds(ways, 3, lambda w: log.append(("check", w)), measure)
    order = [w for rnd in range(3) for w in ab_rounds.way_order(list(ways), rnd)]
    assert current == order
    assert log == [entry for w in order for entry in (("check", w), ("spans", w))]
    first = order.index("0,1")
    assert times["0,1"]["fwd"][0] == float(first + 1)
    assert times["0,1"]["fwd+bwd"][0] == float(first + 1) + 10.0
    assert all(len(t["fwd"]) == len(t["fwd+bwd"]) == 3 for t in times.values())
    rows = [{"family": "f", "rank": r, "times": times} for r in (0, 1)]
    assert deal_scan.slowest(rows)["f"]["package"]["fwd"][1] == 1.0


def test_a_two_way_report_heads_its_columns_by_its_ways(monkeypatch, tmp_path):
    """``ab_rounds.two_way_report``: the A/Bs' one table (in_place_ab, pieces_ab,
    launch_ab): rows by family and rank, each way's ms, the ratio, the extra columns."""
    monkeypatch.setattr(ab_rounds, "run_meta", lambda args, world: dict(
        device="GPU", date="today", shape="shape", command="cmd"))
    rows = [dict(family=f, rank=r, ms={"a": 2.0 + r, "b": 1.0}, ratio=0.5, same=r == 0)
            for f in ("y", "x") for r in (1, 0)]
    out = str(tmp_path / "t")
    ab_rounds.two_way_report(argparse.Namespace(out=out), 2, rows, ("a", "b"),
                             after=(("same bits", lambda r: r["same"]),))
    lines = (tmp_path / "t.md").read_text().splitlines()
    assert lines[3] == "| family | rank | a ms | b ms | b / a | same bits |"
    assert lines[5:] == ["| x | 0 | 2.000 | 1.000 | 0.500 | True |",
                         "| x | 1 | 3.000 | 1.000 | 0.500 | False |",
                         "| y | 0 | 2.000 | 1.000 | 0.500 | True |",
                         "| y | 1 | 3.000 | 1.000 | 0.500 | False |"]
