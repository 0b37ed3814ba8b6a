"""Slice masks in megatron-core's GPTModel (issue 42): a mask builder per micro-batch.

A pack of documents split at EOD runs through ``mask_batches.shard_mask_batch`` with each
shipped builder (prefix-LM, shared question, documents) and ``DocumentGPTModel`` (RoPE
reads the batch's positions, since the 'area' layout places tokens anywhere). CP=2 must
give CP=1's loss and gradients; the documents builder must also give the independent
per-document reference (megatron-core's own attention on each document alone). A builder
flag that names nothing, and a layer window beside a mask, are refused.
"""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("megatron.core")

from tests.distributed import run_ranks  # noqa: E402
from tests.megatron import harness  # noqa: E402
from tests.megatron.harness import EOD  # noqa: E402

TOL = dict(rtol=1e-4, atol=1e-5)
DOCS = (9, 30, 11, 14)  # 64 tokens: the question (9), a long answer, two more documents
BUILDERS = ("documents", "prefix_lm", "shared_question")


def _mask_step(full: dict, weights: dict, builder: str, cp: int) -> dict | None:
    from megatron.core import parallel_state

    from megatron_burst.megatron import mask_batches
    from megatron_burst.megatron.document_model import as_document_model
    from tests.megatron import cpu_llama as cm

    model = as_document_model(harness.burst_model(1, 1, cp, weights))
    group = parallel_state.get_context_parallel_group()
    local, params = mask_batches.shard_mask_batch(full, getattr(mask_batches, builder), EOD,
                                                  group)
    loss = cm.train_step(model, {**local, "packed_seq_params": params},
                         num_tokens=int(full["loss_mask"].sum()))
    grads = harness.gather_full_grads(model)
    return {"loss": float(loss), "grads": grads} if harness.reports_here() else None


def _refusals(weights: dict) -> list[str]:
    from megatron_burst.megatron import mask_batches

    said = []
    for spec in ("no_such_module_xyz:f", "megatron_burst.megatron.mask_batches:nothing", "x"):
        try:
            mask_batches.load_builder(spec)
            said.append("no error")
        except ValueError as err:
            said.append(str(err))
    return said


def _cases(rank: int, world: int) -> dict:
    full, weights, reference = harness.packed_reference(DOCS, 5)
    out = {"reference": reference, "refusals": _refusals(weights)}
    for builder in BUILDERS:
        for cp in (1, 2):
            out[f"{builder}_cp{cp}"] = _mask_step(full, weights, builder, cp)
    return out


def _close(a: dict, b: dict) -> None:
    assert a["loss"] == pytest.approx(b["loss"], rel=1e-5)
    assert set(a["grads"]) == set(b["grads"])
    for name in a["grads"]:
        torch.testing.assert_close(a["grads"][name], b["grads"][name], **TOL, msg=name)


def test_mask_builders_give_cp1_at_cp2():
    reports = run_ranks(2, _cases)
    cases = {"reference": reports[0]["reference"]}
    for name in reports[0]:
        if name not in ("reference", "refusals"):
            cases[name] = harness.merge_stage_reports([r[name] for r in reports])
    for builder in BUILDERS:
        _close(cases[f"{builder}_cp2"], cases[f"{builder}_cp1"])
    _close(cases["documents_cp2"], cases["reference"])  # independent: per-document attention
    # Prefix-LM and shared question really differ from per-document causal attention.
    assert cases["prefix_lm_cp1"]["loss"] != pytest.approx(cases["reference"]["loss"])
    assert cases["shared_question_cp1"]["loss"] != pytest.approx(cases["reference"]["loss"])
    said = reports[0]["refusals"]
    assert all(s.startswith("--burst-mask-builder") for s in said), said
