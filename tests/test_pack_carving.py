"""A document pack's plan carving its large documents (``thresholds.CARVE_PACKS``, off by
default: timed on 2 GPUs, most packs ran slower carved; ``thresholds.PACK_CARVE_MIN``, the
shortest side it carves, travels in the plan's key).

A pack's whole documents run as one varlen call made from the shard's arrays. Where the
plan carves, the whole documents of at least the grain rows leave that call and join the
split documents' blocks, which ``plan_calls`` carves into cores of few shapes (dense calls)
and strips. Checked here: every visible pair of a member's own documents lies in exactly
one call, counted pair by pair; the key carries the grain only for a plain mask with the
switch on; and packs stay exact against the float64 reference on 1-3 gloo ranks and on
Ulysses members (out, lse, dq, dk, dv), causal and full, both backwards, with the grain set
small enough to carve their documents, their plans holding cores.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from megatron_burst.attention import call_plan, prepare, varying_masks
from megatron_burst.kernels import thresholds
from megatron_burst.kernels.pack_calls import alone_shard, carved_whole
from megatron_burst.plan.blocks import Mask

from .distributed import run_ranks
from .grid import TOL, reduce_errors, run_case
from .test_shape_free_cores import _is_side

GRAIN = 8
PACKS = ((3, 40, 5, 17, 9, 30), (64, 2, 2, 19, 5), (11, 7, 25, 1, 33, 6, 21))


def _visible(blk) -> np.ndarray:
    """A full or causal block's visible pairs as a 0/1 matrix (own coordinates)."""
    n, m = blk.q_stop - blk.q_start, blk.k_stop - blk.k_start
    assert blk.kind in ("full", "causal"), blk
    full = np.ones((n, m), dtype=np.int64)
    return full if blk.kind == "full" else np.tril(full, m - n)


def coverage(calls, rows: int) -> np.ndarray:
    """How many calls compute each (query row, key row) pair of a member's rows."""
    seen = np.zeros((rows, rows), dtype=np.int64)
    for call in calls:
        if not call.varlen:
            b = call.blocks[0]
            seen[b.q_start:b.q_stop, b.k_start:b.k_stop] += _visible(b)
            continue
        q_rows = np.concatenate([np.arange(a, z) for a, z in call.q_runs])
        k_rows = np.concatenate([np.arange(a, z) for a, z in call.k_runs])
        for i, blk in enumerate(call.sequence_blocks()):
            q = q_rows[call.cu_q[i]:call.cu_q[i + 1]]
            k = k_rows[call.cu_k[i]:call.cu_k[i + 1]]
            seen[np.ix_(q, k)] += _visible(blk)
    return seen


def expected(lens, causal: bool) -> np.ndarray:
    rows = sum(lens)
    want = np.zeros((rows, rows), dtype=np.int64)
    start = 0
    for n in lens:
        block = np.tril(np.ones((n, n), dtype=np.int64)) if causal else np.ones((n, n), int)
        want[start:start + n, start:start + n] = block
        start += n
    return want


@pytest.mark.parametrize("least", [GRAIN, 3 * GRAIN])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("lens", PACKS + ((3, 0, 5, 2),))
def test_every_pair_of_a_pack_lies_in_exactly_one_call(lens, causal, least):
    mask = Mask(causal=causal)
    calls = carved_whole((), alone_shard(lens), mask, GRAIN, least)  # carved from ``least``
    assert np.array_equal(coverage(calls, sum(lens)), expected(lens, causal))
    dense = [c.blocks[0] for c in calls if not c.varlen]
    assert bool(dense) == (max(lens) >= least)
    for b in dense:  # each core lies in a document of at least ``least`` rows
        start = np.searchsorted(np.cumsum(lens), b.q_start, side="right")
        assert lens[start] >= least, (b, lens)
    for b in dense:  # cores: the grain times a power of two on each side
        assert _is_side(b.q_stop - b.q_start, GRAIN) and _is_side(b.k_stop - b.k_start, GRAIN)
    uncarved = carved_whole((), alone_shard(lens), mask, None)
    assert len(uncarved) == 1 and uncarved[0].varlen  # no grain: one call, as before
    assert np.array_equal(coverage(uncarved, sum(lens)), expected(lens, causal))


def test_the_grain_is_in_a_pack_s_key_only_for_a_plain_mask_with_the_switch_on(monkeypatch):
    import megatron_burst as mb

    pack = mb.pack_documents(torch.tensor([0, 40, 64]))
    ring = call_plan.RingKey((0, 1), 0, None)

    def key(mask, **kw):
        return call_plan.plan_key("whole_docs", 2, pack, mask, 1, ring, "ring", **kw)

    assert not thresholds.CARVE_PACKS  # the package's default: on 2 GPUs most packs lost
    assert key(Mask(causal=True)).grain is None
    monkeypatch.setattr(thresholds, "CARVE_PACKS", True)
    assert key(Mask(causal=True)).grain == thresholds.SHAPE_FREE_GRAIN
    monkeypatch.setattr(thresholds, "PACK_CARVE_MIN", 4096)  # by value, in the key
    assert key(Mask(causal=True)).least == 4096 != key(Mask(causal=True, window=(4, 0))).least
    assert key(Mask(causal=False)).grain == thresholds.SHAPE_FREE_GRAIN
    assert key(Mask(causal=True, window=(4, 0))).grain is None  # a band is not carved
    assert key(Mask(causal=True), device_docs=True).grain is None
    assert key(Mask(causal=True), batch=2).grain is None


def pack_worker(rank, world, cases, grain):
    """Each case's partial errors with packs carved at ``grain``, and the count of dense
    calls (cores) in this rank's pack plans."""
    thresholds.CARVE_PACKS, thresholds.SHAPE_FREE_GRAIN = True, grain
    thresholds.PACK_CARVE_MIN = grain
    varying_masks.clear()
    call_plan.clear()
    prepare.PREPARED.clear()
    errors = [run_case(rank, world, 31 + i, **case) for i, case in enumerate(cases)]
    cores = sum(1 for key, plan in call_plan._PLANS.items() if key.pack and key.grain
                for c in plan.calls if not c.varlen)
    return errors, cores


def _cases(ulysses: int = 1) -> list[dict]:
    extra = {"ulysses_size": ulysses} if ulysses > 1 else {}
    return [dict(layout="whole_docs", hq=4, hkv=2, d=8, dtype=torch.float64,
                 backward=("burst", "ring")[i % 2], causal=(True, False)[i // 2 % 2],
                 doc_lens=lens, **extra)
            for i, lens in enumerate(PACKS + PACKS[:1])]


@pytest.mark.parametrize("world,ulysses", [(1, 1), (2, 1), (3, 1), (2, 2)])
def test_carved_packs_stay_exact(world, ulysses):
    cases = _cases(ulysses)
    cases = [dict(c, doc_lens=tuple(n * world for n in c["doc_lens"])) for c in cases]
    results = run_ranks(world, pack_worker, cases, GRAIN)
    errors = reduce_errors([r[0] for r in results])
    bad = [f"{c['doc_lens']} causal={c['causal']} {name}: {e:.3g}"
           for c, err in zip(cases, errors) for name, e in err.items()
           if not e <= TOL[torch.float32]]
    assert not bad, "\n".join(bad)
    assert all(cores for _, cores in results), [cores for _, cores in results]
