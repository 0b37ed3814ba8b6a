"""megatron-core GPTModel with BurstAttention on CPU gloo ranks matches the CP=1 reference.

The reference is megatron-core's own local attention at TP=PP=CP=1 (no BurstAttention code);
every parallel setup loads its weights, and loss and gradients (all parameters, including the
embedding, a QKV weight and the final norm) must match to fp32 tolerance. Each spawn runs
several parallel setups in turn, because starting ranks costs more than a tiny step.
"""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("megatron.core")

from tests.distributed import run_ranks  # noqa: E402
from tests.megatron import harness  # noqa: E402

TOL = dict(rtol=1e-4, atol=1e-5)


def _reference_case():
    """The batch, the reference weights, and the CP=1 reference's loss and grads."""
    import warnings

    warnings.filterwarnings("ignore")
    from tests.megatron import cpu_llama as cm

    batch = cm.random_batch(harness.SHAPE)
    weights, loss, grads = harness.reference_step(batch)
    return batch, weights, {"reference": {"loss": loss, "grads": grads}}


def _four_rank_setups(rank: int, world: int) -> dict:
    batch, weights, out = _reference_case()
    out["cp4"] = harness.parallel_step(batch, weights, cp=4)
    out["tp2_cp2"] = harness.parallel_step(batch, weights, tp=2, cp=2)
    out["tp2_cp2_sp"] = harness.parallel_step(batch, weights, tp=2, cp=2, sequence_parallel=True)
    out["pp2_cp2"] = harness.parallel_step(batch, weights, pp=2, cp=2)
    # Megatron's hierarchical CP sizes [2, 2]: a double ring of 2 "nodes" x 2 ranks.
    out["cp4_double_ring"] = harness.parallel_step(
        batch, weights, cp=4, hierarchical_context_parallel_sizes=[2, 2])
    # Ulysses 2 x ring 2, one Ulysses group (2 ranks, one ring position) per node.
    out["cp4_ulysses2_double"] = harness.parallel_step(
        batch, weights, cp=4, spec_kwargs={"ulysses_size": 2, "intra_node_size": 2})
    return out


def _two_rank_setups(rank: int, world: int) -> dict:
    batch, weights, out = _reference_case()
    out["cp2"] = harness.parallel_step(batch, weights, cp=2)
    out["cp2_full_recompute"] = harness.parallel_step(batch, weights, cp=2, recompute="full")
    out["cp2_selective_recompute"] = harness.parallel_step(batch, weights, cp=2, recompute="selective")
    # An fp16 overflow guard in Megatron whose net softmax scale is unchanged.
    out["cp2_qk_layer_scaling"] = harness.parallel_step(
        batch, weights, cp=2, apply_query_key_layer_scaling=True
    )
    return out


@pytest.fixture(scope="module")
def four_rank() -> dict:
    reports = run_ranks(4, _four_rank_setups, timeout=900)
    return _collect(reports)


@pytest.fixture(scope="module")
def two_rank() -> dict:
    reports = run_ranks(2, _two_rank_setups, timeout=600)
    return _collect(reports)


def _collect(reports: list) -> dict:
    cases = {"reference": reports[0]["reference"]}
    for name in reports[0]:
        if name != "reference":
            cases[name] = harness.merge_stage_reports([r[name] for r in reports])
    return cases


def _assert_matches_reference(cases: dict, name: str) -> None:
    ref, got = cases["reference"], cases[name]
    torch.testing.assert_close(got["loss"], ref["loss"], **TOL)
    assert set(got["grads"]) == set(ref["grads"]), "a parameter is missing from some stage"
    for key in harness.GRAD_NAMES + tuple(ref["grads"]):
        torch.testing.assert_close(got["grads"][key], ref["grads"][key], **TOL, msg=lambda m: f"{key}: {m}")


@pytest.mark.parametrize(
    "name", ["cp2", "cp2_full_recompute", "cp2_selective_recompute", "cp2_qk_layer_scaling"]
)
def test_two_rank_parallel_setup_matches_cp1(two_rank: dict, name: str) -> None:
    _assert_matches_reference(two_rank, name)


@pytest.mark.parametrize("name", ["cp4", "tp2_cp2", "tp2_cp2_sp", "pp2_cp2", "cp4_double_ring",
                                  "cp4_ulysses2_double"])
def test_four_rank_parallel_setup_matches_cp1(four_rank: dict, name: str) -> None:
    _assert_matches_reference(four_rank, name)


def test_reference_gradients_are_not_trivial(two_rank: dict) -> None:
    # Guards the comparisons above against passing on all-zero gradients.
    for key in harness.GRAD_NAMES:
        assert two_rank["reference"]["grads"][key].abs().max() > 1e-6, key
