"""``benchmarks/trace_methods.py``: the operators inside each method's labelled calls, per
call, and where two methods part (what the next GPU run of issue 41's gap reads)."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import trace_methods  # noqa: E402


def _span(name, ts, dur, tid=1, cat="user_annotation"):
    return dict(name=name, ph="X", ts=ts, dur=dur, tid=tid, cat=cat)


def test_operators_are_counted_inside_their_methods_calls_per_call():
    events = [_span("method:auto", 0, 100), _span("method:auto", 200, 120),
              _span("method:forced", 400, 80),
              _span("nccl:send", 10, 30, cat="cpu_op"), _span("nccl:send", 210, 50, cat="cpu_op"),
              _span("aten::cat", 20, 5, cat="cpu_op"), _span("aten::cat", 410, 5, cat="cpu_op"),
              _span("aten::cat", 50, 7, tid=2, cat="cpu_op"),  # another thread: not the call's
              _span("nccl:send", 500, 9, cat="cpu_op")]  # after every call: nobody's
    methods = trace_methods.per_method(events)
    assert methods["auto"]["calls"] == 2 and methods["auto"]["median_us"] == 110
    assert methods["auto"]["ops"] == {"nccl:send": 40.0, "aten::cat": 2.5}
    assert methods["forced"]["ops"] == {"aten::cat": 5.0}
    assert trace_methods.differences(methods, "auto", "forced", top=1) == [
        ("nccl:send", 40.0, 0.0)]


def test_host_kinds_names_the_operators_that_grow_most_with_the_call():
    import host_kinds

    tiny = {"aten::cat": 0.1, "cudaMalloc": 0.0, "nccl:send": 0.2}
    large = {"aten::cat": 0.15, "cudaMalloc": 2.0, "nccl:send": 0.1, "aten::copy_": 0.5}
    grown = host_kinds.growth(tiny, large, top=2)
    assert [g["op"] for g in grown] == ["cudaMalloc", "aten::copy_"]
    assert grown[0] == dict(op="cudaMalloc", small_ms=0.0, large_ms=2.0)


def test_a_live_profile_counts_only_what_runs_inside_the_calls():
    """``op_spans.profiled_calls``: the staging and syncs between calls (here an add and a
    multiply) are the harness's, not the call's (a matmul), whose time is per call."""
    import torch

    import op_spans

    x = torch.randn(64, 64)
    ms = op_spans.profiled_calls(lambda: x @ x, 3, between=lambda: (x + 1) * 2)
    assert "aten::mm" in ms or "aten::matmul" in ms
    assert "aten::add" not in ms and "aten::mul" not in ms
    # Own time leaves out what an operator calls: matmul's own is a sliver of its total (its
    # mm), a margin two profiles' timing noise does not cross (mm against mm did, once: a
    # slow spell in the second profile read its own time 4.5x the first's total).
    own = op_spans.profiled_calls(lambda: x @ x, 3, self_time=True)
    assert own.get("aten::matmul", 0) < ms["aten::matmul"]


def test_spans_are_matched_on_their_own_thread():
    import op_spans

    spans = [("call:", 1, 0.0, 10.0)]
    ops = [("a", 1, 5.0, 2.0), ("a", 2, 5.0, 3.0), ("b", 1, 10.0, 1.0)]  # b starts at the end
    assert op_spans.ops_in_spans(spans, ops) == {"a": 2.0}
