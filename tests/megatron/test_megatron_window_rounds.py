"""Window layers in megatron-core's GPTModel at CP=4 take a round each way round the ring.

A sliding-window layer (``window_size`` (5, 0), the zigzag layout Megatron shards by) reads
the chunk before each of a rank's chunks: its second chunk reads the next rank's, which a
one-way ring brought at its last step. With the rounds (``attention.ring_rounds``)
CP=4 must still give CP=1's loss and gradients (every parameter, fp32 tolerance), on 4
gloo ranks, with both backwards, and the layers' plans must be the rounds'.
"""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("megatron.core")

from tests.distributed import run_ranks  # noqa: E402
from tests.megatron import harness  # noqa: E402

TOL = dict(rtol=1e-4, atol=1e-5)
WINDOW = (5, 0)  # 64 tokens on 4 ranks: 8-token zigzag chunks, each reads the one before


def _cases(rank: int, world: int) -> dict:
    import warnings

    warnings.filterwarnings("ignore")
    import megatron_burst.attention.call_plan as call_plan
    from tests.megatron import cpu_llama as cm

    batch = cm.random_batch(harness.SHAPE)
    weights, causal_loss, _ = harness.reference_step(batch)
    out = {"cp1": harness.parallel_step(batch, weights, cp=1, window_size=WINDOW),
           "causal_loss": causal_loss}
    for backward in ("burst", "ring"):
        call_plan.clear()
        out[f"cp4_{backward}"] = harness.parallel_step(
            batch, weights, cp=4, window_size=WINDOW, spec_kwargs={"backward": backward})
        plans = list(call_plan._PLANS.values())
        out[f"rounds_{backward}"] = bool(plans) and all(
            any(h.kind == "back" for s in p.forward.steps for h in s.hops) for p in plans)
    return out


@pytest.fixture(scope="module")
def cases() -> dict:
    reports = run_ranks(4, _cases, timeout=900)
    merged = {name: harness.merge_stage_reports([r[name] for r in reports])
              for name in ("cp1", "cp4_burst", "cp4_ring")}
    merged["rounds"] = [[r["rounds_burst"], r["rounds_ring"]] for r in reports]
    merged["causal_loss"] = reports[0]["causal_loss"]
    return merged


@pytest.mark.parametrize("backward", ["burst", "ring"])
def test_window_layers_at_cp4_give_cp1(cases, backward):
    got, want = cases[f"cp4_{backward}"], cases["cp1"]
    assert got["loss"] == pytest.approx(want["loss"], rel=1e-5)
    assert set(got["grads"]) == set(want["grads"])
    for name in want["grads"]:
        torch.testing.assert_close(got["grads"][name], want["grads"][name], **TOL, msg=name)


def test_the_window_layers_plans_are_the_rounds(cases):
    assert cases["rounds"] == [[True, True]] * 4
    # the window is honoured: plain causal attention (the reference) gives another loss
    assert cases["cp1"]["loss"] != pytest.approx(cases["causal_loss"], rel=1e-4)
