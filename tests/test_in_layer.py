"""``benchmarks/in_layer.py``: attention timed between a layer's matrix products.

A step runs the products and attention in the layer's order and marks the spans around
attention's forward and backward; the ranks meet before each span; the efficiency is the
faster one-GPU span over GPUs x the slower rank's; a whole run on CPU ranks (gloo) writes a
row per family with every rank's figures; every backward stores fresh gradients; a run with
a new pack a step times only the families with documents, FlexAttention's block mask made in
each step; a knob it cannot honour is refused by name.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCH))
in_layer = pytest.importorskip("in_layer")


class _Traced:
    """Stands for the layer and attention: records what runs, in order."""

    def __init__(self, log: list):
        self.log = log

    def before(self):
        self.log.append("qkv")

    def middle(self):
        self.log.append("mlp")

    def after(self):
        self.log.append("qkv-back")


class _Out:
    def __init__(self, log):
        self.log = log

    def backward(self, do):
        self.log.append("attn-back")


def test_a_step_runs_the_layer_in_its_order_and_times_every_timed_step(monkeypatch):
    log, met = [], []
    monkeypatch.setattr(in_layer, "meet", lambda ranks: met.append(len(log)))
    monkeypatch.setattr(in_layer.dist, "barrier", lambda: None)

    def attend(*inputs):
        log.append("attn")
        return _Out(log)

    args = SimpleNamespace(warmup=2, iters=3)
    steps = in_layer.same(attend, [], None)
    got = in_layer.in_layer(steps, _Traced(log), torch.device("cpu"), args, torch.zeros(1))
    assert log == ["qkv", "attn", "mlp", "attn-back", "qkv-back"] * 5
    assert met == [n + 5 * i for i in range(5) for n in (1, 3)]  # before each span, each step
    assert got["steps"] == 3 and got["ahead_fwd"] == got["ahead_bwd"] == 3
    assert got["fwd_ms"] >= 0 and got["step_gpu_ms"] >= got["fwd_ms"] + got["bwd_ms"]


class _Layer:
    def before(self):
        pass

    middle = after = before


def test_every_backward_stores_its_own_gradients_rather_than_adding_to_the_last(monkeypatch):
    """Training's q, k and v are not leaves, so no step adds into an earlier step's grads."""
    monkeypatch.setattr(in_layer.dist, "barrier", lambda: None)
    x = torch.ones(3, requires_grad=True)
    seen = []

    def attend(t):
        return t * 2.0

    args = SimpleNamespace(warmup=1, iters=2)
    do = torch.ones(3)
    in_layer.in_layer(in_layer.same(attend, [x], do), _Layer(), torch.device("cpu"), args,
                      None)
    seen.append(x.grad.clone())
    in_layer.alone(attend, [x], do, torch.device("cpu"), args, False)
    seen.append(x.grad.clone())
    for grad in seen:  # three (and three) backwards ran: an add would give 6, not 2
        assert torch.equal(grad, torch.full((3,), 2.0))


def test_the_one_gpu_layer_meets_no_one():
    assert in_layer.meet(None) is None  # one GPU: no collective to wait for


def _figures(fwd, bwd, alone):
    return dict(in_layer=dict(fwd_ms=fwd, bwd_ms=bwd), alone_ms=alone)


def test_efficiency_is_the_faster_one_gpu_over_gpus_times_the_slower_rank():
    row = dict(burst_ranks=[_figures(1.0, 3.0, 5.0), _figures(1.25, 2.5, 4.0)],
               one_gpu_plan=_figures(2.0, 5.0, 8.0), one_gpu_flex=_figures(1.5, 6.0, 9.0))
    in_layer.efficiencies(row, 2)
    assert row["efficiency_in_layer_fwd"] == pytest.approx(1.5 / (2 * 1.25))
    assert row["efficiency_in_layer_bwd"] == pytest.approx(5.0 / (2 * 3.0))
    assert row["efficiency_in_layer_fwd_bwd"] == pytest.approx(7.0 / (2 * 4.0))
    assert row["efficiency_alone_fwd_bwd"] == pytest.approx(8.0 / (2 * 5.0))


def test_a_run_on_cpu_ranks_writes_every_rank_s_figures(tmp_path):
    out = tmp_path / "run"
    done = subprocess.run([sys.executable, str(BENCH / "in_layer.py"), "--cpu-smoke",
                           "--families", "causal,block_causal_document", "--out", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    run = json.loads((tmp_path / "run.json").read_text())
    assert [r["family"] for r in run["rows"]] == ["causal", "block_causal_document"]
    for row in run["rows"]:
        assert len(row["burst_ranks"]) == 2 and "one_gpu_flex" not in row
        for figures in [*row["burst_ranks"], row["one_gpu_plan"]]:
            assert figures["in_layer"]["steps"] == run["meta"]["iters"] == 2
            assert figures["in_layer"]["fwd_ms"] > 0 and figures["alone_ms"] > 0
        burst = max(r["in_layer"]["fwd_ms"] for r in row["burst_ranks"])
        assert row["efficiency_in_layer_fwd"] == pytest.approx(
            row["one_gpu_plan"]["in_layer"]["fwd_ms"] / (2 * burst))
    assert "| block_causal_document |" in (tmp_path / "run.md").read_text()


@pytest.mark.parametrize("flag,value", [("--forward-dense-area", "1048576"),
                                        ("--shape-free-grain", "-1")])
def test_a_knob_it_cannot_honour_is_refused_by_name(tmp_path, flag, value):
    """The GPU kernel's threshold on CPU ranks, a negative carving grain: refused before any
    rank starts."""
    done = subprocess.run([sys.executable, str(BENCH / "in_layer.py"), "--cpu-smoke",
                           flag, value, "--out", str(tmp_path / "r")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and flag in done.stderr
    assert not (tmp_path / "r.json").exists()


def test_new_packs_give_a_new_mask_a_step_and_none_for_a_mask_without_documents():
    sm = pytest.importorskip("slice_masks")
    masks = sm.new_packs("causal_document", 256, 1 / 32, 4)
    assert len(masks) == 4 and len(set(masks)) == 4
    assert all(m.q_ranges[-1][1] == 256 for m in masks)
    assert sm.new_packs("causal", 256, 1 / 32, 4) is None


def test_flex_makes_each_step_s_block_mask_before_its_call():
    used = []

    class _Flex:
        def use(self, mask):
            used.append(mask)

    flex = _Flex()
    pack = in_layer.flex_packs(flex, ["m0", "m1", "m2"], ["q", "k", "v"], "do")
    assert [pack(i) for i in (0, 2)] == [(flex, ["q", "k", "v"], "do")] * 2
    assert used == ["m0", "m2"]


def test_a_run_with_a_new_pack_a_step_times_only_the_families_with_documents(tmp_path):
    out = tmp_path / "run"
    done = subprocess.run([sys.executable, str(BENCH / "in_layer.py"), "--cpu-smoke",
                           "--new-packs", "--families", "causal,causal_document",
                           "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    run = json.loads((tmp_path / "run.json").read_text())
    assert run["meta"]["new_pack_every_step"] is True
    (row,) = run["rows"]
    assert row["family"] == "causal_document" and row["packs"] == 3  # 1 warm-up + 2 timed
    for figures in [*row["burst_ranks"], row["one_gpu_plan"]]:
        assert figures["in_layer"]["steps"] == 2 and "alone_ms" not in figures
    burst = max(r["in_layer"]["bwd_ms"] for r in row["burst_ranks"])
    assert row["efficiency_in_layer_bwd"] == pytest.approx(
        row["one_gpu_plan"]["in_layer"]["bwd_ms"] / (2 * burst))
    assert "efficiency_alone_fwd_bwd" not in row
    text = (tmp_path / "run.md").read_text()
    assert "a new document pack every step" in text and "| causal_document |" in text
