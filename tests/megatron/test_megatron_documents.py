"""Document masks in megatron-core's GPTModel on CPU gloo ranks, and the masks refused.

A pack of documents split at EOD tokens (some short ones kept whole, one long one split
over the ranks, one cut into pieces, the pack ending in a short document; EOD excluded from
the loss as --eod-mask-loss does) runs through `shard_document_batch` and
`DocumentGPTModel`. At CP=1 it must equal the per-document reference (megatron-core's own
attention on each document alone, positions from 0); at CP=2 (whole_docs and zigzag), CP=4,
TP2 x CP2 (with and without sequence parallelism) and PP2 x CP2 it must equal CP=1. Each
spawn runs several cases, because starting ranks costs more than a tiny step.
"""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("megatron.core")

from tests.distributed import run_ranks  # noqa: E402
from tests.megatron import harness  # noqa: E402
from tests.megatron.harness import EOD, packed_batch  # noqa: E402

TOL = dict(rtol=1e-4, atol=1e-5)
# 64 tokens: at CP=2 the 40-token document is split, 5 and 8 are whole, 11 is cut in two.
DOCS = (5, 40, 11, 8)


def _start(rank: int) -> tuple:
    """The pack, reference weights, and the per-document reference's loss and grads."""
    full, weights, reference = harness.packed_reference(DOCS, 3)
    return full, weights, {"reference": reference}


def _document_step(full: dict, weights: dict, tp: int = 1, pp: int = 1, cp: int = 1,
                   layout: str = "whole_docs", **config_kwargs) -> dict | None:
    """Loss and gathered grads of one document-masked step; None on non-reporting ranks."""
    from megatron.core import parallel_state

    from megatron_burst.megatron.document_model import as_document_model
    from megatron_burst.megatron.documents import shard_document_batch
    from tests.megatron import cpu_llama as cm

    model = as_document_model(harness.burst_model(tp, pp, cp, weights, **config_kwargs))
    group = parallel_state.get_context_parallel_group()
    local, params = shard_document_batch(full, EOD, group, layout)
    batch = {**local, "packed_seq_params": params}
    loss = cm.train_step(model, batch, num_tokens=int(full["loss_mask"].sum()))
    grads = harness.gather_full_grads(model)
    return {"loss": float(loss), "grads": grads} if harness.reports_here() else None


def _shards_gather_back(full: dict, layout: str) -> bool:
    """Every sharded tensor of the batch unshards to the pack, positions restarted."""
    from megatron.core import parallel_state

    import megatron_burst as mb
    from megatron_burst.megatron.documents import shard_document_batch

    group = parallel_state.get_context_parallel_group()
    local, params = shard_document_batch(full, EOD, group, layout)
    back = {key: mb.unshard_seq(value, group, layout=layout, seq_dim=1,
                                cu_seqlens=params.cu_seqlens_q) for key, value in local.items()}
    starts = [0, 5, 45, 56]
    expected = torch.cat([torch.arange(n) for n in DOCS])[None]
    return (all(torch.equal(back[key], full[key]) for key in ("tokens", "labels", "loss_mask"))
            and torch.equal(back["position_ids"], expected)
            and params.cu_seqlens_q.tolist() == starts + [64])


def _plans_per_micro_batch(weights: dict) -> list[dict]:
    """How often the per-pack planning ran, per micro-batch: two packs, then the first again.

    Counts the placement of the documents, the blocks of a (query, key) member pair, and
    the grouping of a pair's blocks into kernel calls, over a whole forward and backward
    of the 2-layer model at CP=2.
    """

    from megatron.core import parallel_state

    import megatron_burst.plan.placement as placement
    from megatron_burst.megatron.document_model import as_document_model
    from megatron_burst.megatron.documents import shard_document_batch
    from tests.megatron import cpu_llama as cm

    model = as_document_model(harness.burst_model(1, 1, 2, weights))
    assert len(model.decoder.layers) >= 2  # the count must cover layers after the first
    group = parallel_state.get_context_parallel_group()
    counts = []
    batches = [shard_document_batch(packed_batch(lens, seed), EOD, group)
               for lens, seed in ((DOCS, 3), ((9, 30, 6, 19), 4))]
    for local, params in (*batches, batches[0]):
        seen = {"placements": 0, "pair_blocks": 0, "call_plans": 0}
        with harness.counting_plans(seen):
            placement.placement.cache_clear()  # so a pack placed while sharding counts too
            cm.train_step(model, {**local, "packed_seq_params": params},
                          num_tokens=int(local["loss_mask"].sum()))
        counts.append(seen)
    mode = model.decoder.layers[0].self_attention.core_attention.topology.backward
    return [mode, *counts]


def _two_rank_cases(rank: int, world: int) -> dict:
    full, weights, out = _start(rank)
    out["plans"] = _plans_per_micro_batch(weights)
    out["cp1"] = _document_step(full, weights, cp=1)
    out["cp2"] = _document_step(full, weights, cp=2)
    out["cp2_zigzag"] = _document_step(full, weights, cp=2, layout="zigzag")
    out["cp2_pack_zigzag"] = _document_step(full, weights, cp=2, layout="pack_zigzag")
    out["cp2_full_recompute"] = _document_step(full, weights, cp=2, recompute="full")
    out["gathers_back"] = all(_shards_gather_back(full, layout)
                              for layout in ("whole_docs", "zigzag", "pack_zigzag"))
    out["masks"] = _mask_refusals()
    out["models"] = _model_refusals(weights)
    return out


def _four_rank_cases(rank: int, world: int) -> dict:
    full, weights, out = _start(rank)
    out["cp1"] = _document_step(full, weights, cp=1)
    out["cp4"] = _document_step(full, weights, cp=4)
    out["tp2_cp2"] = _document_step(full, weights, tp=2, cp=2)
    out["tp2_cp2_sp"] = _document_step(full, weights, tp=2, cp=2, sequence_parallel=True)
    out["pp2_cp2"] = _document_step(full, weights, pp=2, cp=2)
    out["tp2_cp2_pack_zigzag"] = _document_step(full, weights, tp=2, cp=2,
                                                layout="pack_zigzag")
    return out


def _collect(reports: list) -> dict:
    cases = {"reference": reports[0]["reference"]}
    for name in ("gathers_back", "masks", "models", "plans"):
        cases[name] = [r.get(name) for r in reports]
    for name in reports[0]:
        if name not in cases:
            cases[name] = harness.merge_stage_reports([r[name] for r in reports])
    return cases


@pytest.fixture(scope="module")
def two_rank() -> dict:
    return _collect(run_ranks(2, _two_rank_cases, timeout=600))


@pytest.fixture(scope="module")
def four_rank() -> dict:
    return _collect(run_ranks(4, _four_rank_cases, timeout=900))


def _assert_close(got: dict, ref: dict) -> None:
    torch.testing.assert_close(got["loss"], ref["loss"], **TOL)
    assert set(got["grads"]) == set(ref["grads"]), "a parameter is missing from some stage"
    for key in harness.GRAD_NAMES + tuple(ref["grads"]):
        torch.testing.assert_close(got["grads"][key], ref["grads"][key], **TOL,
                                   msg=lambda m: f"{key}: {m}")


def test_cp1_document_masks_match_the_per_document_reference(two_rank: dict) -> None:
    _assert_close(two_rank["cp1"], two_rank["reference"])
    for key in harness.GRAD_NAMES:  # guards against passing on all-zero gradients
        assert two_rank["reference"]["grads"][key].abs().max() > 1e-6, key


@pytest.mark.parametrize("name", ["cp2", "cp2_zigzag", "cp2_pack_zigzag",
                                  "cp2_full_recompute"])
def test_two_rank_document_masks_match_cp1(two_rank: dict, name: str) -> None:
    _assert_close(two_rank[name], two_rank["cp1"])


@pytest.mark.parametrize("name", ["cp4", "tp2_cp2", "tp2_cp2_sp", "pp2_cp2",
                                  "tp2_cp2_pack_zigzag"])
def test_four_rank_document_masks_match_cp1(four_rank: dict, name: str) -> None:
    _assert_close(four_rank[name], four_rank["cp1"])
    _assert_close(four_rank[name], four_rank["reference"])


def test_a_pack_is_planned_once_per_micro_batch(two_rank: dict) -> None:
    """Every layer and the backward reuse the plans of the batch's pack: placing the
    documents once, the blocks of each of the 2x2 member pairs once, and the kernel calls
    of this rank's 2 forward pairs and the 2 reverse pairs once, whatever the number of
    layers; a new pack is planned anew, and the first pack again (its DocumentParams kept)
    costs nothing."""
    for mode, *rank_counts in two_rank["plans"]:
        first, second, again = rank_counts
        # The ring backward computes the forward's pairs again, and plans the pair that
        # holds this rank's K/V (its calls say the dtype the dK/dV come home in:
        # ``PassPlan.wire``); the burst backward runs the reverse pairs (the visitors'
        # queries against this rank's keys), the one that holds its queries among them.
        pairs = 3 if mode == "ring" else 4
        assert first == second == {"placements": 1, "pair_blocks": 4, "call_plans": pairs}, \
            rank_counts
        assert again == {"placements": 0, "pair_blocks": 0, "call_plans": 0}, rank_counts


def test_document_shards_gather_back_to_the_pack(two_rank: dict) -> None:
    assert two_rank["gathers_back"] == [True, True]


# ------------------------------------------------------------------ refused masks (issue 14)


def _mask_refusals() -> dict:
    """Each mask the adapter cannot honour, given to a CP=2 layer: the ValueError it raised
    (or "accepted" and whether the output matched the unmasked one)."""
    from megatron.core import parallel_state
    from megatron.core.packed_seq_params import PackedSeqParams
    from megatron.core.transformer.enums import AttnMaskType

    from megatron_burst.megatron.attention import BurstDotProductAttention
    from megatron_burst.megatron.documents import document_params
    from tests.megatron import cpu_llama as cm

    cm.init_parallel(cp=2)
    rank = parallel_state.get_context_parallel_rank()
    config = cm.tiny_llama_config(harness.SHAPE)
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(8, 1, heads, 16, generator=gen) for heads in (4, 2, 2))
    rows = torch.cat([torch.arange(4 * rank, 4 * rank + 4),
                      torch.arange(4 * (3 - rank), 4 * (3 - rank) + 4)])  # zigzag, s = 16
    causal = (torch.arange(16)[None, :] > rows[:, None])[None, None]  # True = masked out
    documents = causal | ((rows[:, None] >= 8) & (torch.arange(16)[None, :] < 8))[None, None]
    cu = torch.tensor([0, 8, 16], dtype=torch.int32)
    outcomes = {}

    def attempt(name, mask_type, mask, params=None, qkv=(q, k, v), converted=True):
        layer = BurstDotProductAttention(config, layer_number=1, attn_mask_type=mask_type)
        layer.positions_follow_documents = converted  # as in a DocumentGPTModel, or not
        try:
            out = layer(*qkv, mask, packed_seq_params=params)
        except ValueError as err:
            outcomes[name] = str(err)
            return
        except Exception as err:  # noqa: BLE001  (recorded: the test names what it wanted)
            outcomes[name] = f"{type(err).__name__}: {err}"
            return
        plain = layer(*qkv, None)
        outcomes[name] = f"accepted, same output: {torch.allclose(out, plain)}"

    attempt("padding", AttnMaskType.padding, torch.zeros(1, 1, 8, 16, dtype=torch.bool))
    attempt("padding_causal", AttnMaskType.padding_causal, causal)
    attempt("document_mask", AttnMaskType.causal, documents)
    attempt("plain_causal", AttnMaskType.causal, causal)
    attempt("float_mask", AttnMaskType.causal, causal.float())
    attempt("full_masking", AttnMaskType.no_mask, causal)
    attempt("full_nothing", AttnMaskType.no_mask, torch.zeros(1, 1, 8, 16, dtype=torch.bool))
    attempt("sbhd_params", AttnMaskType.causal, None,
            PackedSeqParams(qkv_format="sbhd", cu_seqlens_q=cu, cu_seqlens_kv=cu))
    attempt("mask_and_documents", AttnMaskType.causal, causal, document_params(cu))
    attempt("documents_in_a_plain_model", AttnMaskType.causal, None, document_params(cu),
            converted=False)
    attempt("thd_without_cu_seqlens", AttnMaskType.causal, None,
            PackedSeqParams(qkv_format="thd", cu_seqlens_q=None, cu_seqlens_kv=None),
            qkv=(q[:, 0], k[:, 0], v[:, 0]))
    return outcomes


@pytest.mark.parametrize("case, message", [
    ("padding", "cannot apply padding masks"),
    ("padding_causal", "cannot apply padding masks"),
    ("document_mask", "not the plain causal mask"),
    ("float_mask", "must be a bool tensor"),
    ("full_masking", "masks entries of a full"),
    ("sbhd_params", "DocumentParams"),
    ("mask_and_documents", "already define the mask"),
    ("documents_in_a_plain_model", "as_document_model"),
    ("thd_without_cu_seqlens", "needs cu_seqlens_q"),
])
def test_masks_the_adapter_cannot_honour_are_refused(two_rank: dict, case: str,
                                                     message: str) -> None:
    for outcomes in two_rank["masks"]:  # every rank refuses, before any communication
        assert message in outcomes.get(case, "<no ValueError>"), outcomes.get(case)


@pytest.mark.parametrize("case", ["plain_causal", "full_nothing"])
def test_masks_that_add_nothing_are_accepted(two_rank: dict, case: str) -> None:
    for outcomes in two_rank["masks"]:
        assert outcomes[case] == "accepted, same output: True"


def _model_refusals(weights: dict) -> dict:
    """Models `as_document_model` must refuse: the ValueError each raised."""
    from megatron_burst.megatron.document_model import as_document_model

    def attempt(change):
        model = harness.burst_model(1, 1, 2, weights)
        change(model)
        try:
            as_document_model(model)
        except ValueError as err:
            return str(err)
        return "<accepted>"

    return {
        "local_attention": attempt(lambda m: m.decoder.layers[0].self_attention.__setattr__(
            "core_attention", harness.reference_model().decoder.layers[0]
            .self_attention.core_attention)),
        "yarn": attempt(lambda m: setattr(m, "position_embedding_type", "yarn")),
        "mtp": attempt(lambda m: setattr(m.config, "mtp_num_layers", 1)),
    }


@pytest.mark.parametrize("case, message", [
    ("local_attention", "found DotProductAttention"),
    ("yarn", "--position-embedding-type"),
    ("mtp", "--mtp-num-layers"),
])
def test_models_that_cannot_follow_documents_are_refused(two_rank: dict, case: str,
                                                         message: str) -> None:
    for outcomes in two_rank["models"]:
        assert message in outcomes[case], outcomes[case]
