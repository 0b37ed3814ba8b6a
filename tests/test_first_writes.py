"""Each home row's first partial is written, the rest folded in (``first_writes``).

The forward's query rows and the backward's home side (dQ in 'ring', dK/dV in 'burst'),
checked against a row count on the plans of every mask family, random slice masks,
windows, plain sequences and document packs, on 1-4 ranks: a run is written exactly when
none of its rows was touched before it, and the accumulators skip their fill (``fresh``)
exactly when every row's first partial is written. That the results stay exact is what
the ring tests of the families and random masks check (``test_slice_masks``).
"""
from __future__ import annotations

import itertools
import random

import numpy as np
import pytest
import torch

import megatron_burst as mb
from megatron_burst.attention.call_plan import RingKey, build_plan, plan_key
from megatron_burst.kernels.varlen import call_runs, covers
from megatron_burst.plan import mask_families as mf
from megatron_burst.plan.schedule import Mask

from .packs import random_pack
from .test_slice_masks import KNOBS, random_mask


def _plans():
    """(name, every rank's plan) of many calls."""
    rng = random.Random(11)
    for world in (1, 2, 3, 4):
        ring = lambda r: RingKey(tuple(range(world)), r, None) if world > 1 else None  # noqa
        total = 32 * world
        lens = (5, 9, 3, total - 17)
        cases = [(f"{n}", "area", (total,), mf.family(n, lens, **KNOBS)) for n in mf.FAMILIES]
        cases += [(f"random{i}", "area", (total,), random_mask(rng, total)) for i in range(6)]
        cases += [(f"{m}-{layout}", layout, (total,), m) for layout in ("zigzag", "contiguous")
                  for m in (Mask(True), Mask(False), Mask(True, (6, 0)), Mask(False, (3, 4)))]
        pack = mb.pack_documents(torch.tensor(
            [0, *itertools.accumulate(random_pack(rng, 96 * world, "mix"))]))
        cases += [("pack", "whole_docs", pack, Mask(True))]
        for name, layout, docs, mask in cases:
            for backward in ("burst", "ring"):
                yield f"{world}-{name}-{backward}", [build_plan(plan_key(
                    layout, world, docs, mask, 1, ring(r), backward,
                    dense_min_area=float("inf"))) for r in range(world)]


PLANS = list(_plans())


def _check_home(name: str, steps, writes, fresh: bool, rows: int, side: int) -> None:
    """Against a row count: a run of ``side`` (0 queries, 1 keys) is written exactly when
    none of its rows was touched before it (by an earlier call, or an earlier run of its
    own call: a key row two blocks use); ``fresh`` exactly when every row's first partial
    is written."""
    touched = np.zeros(rows, dtype=np.int64)
    first_written = np.zeros(rows, dtype=bool)
    assert len(writes) == len(steps)
    for step, step_writes in zip(steps, writes):
        assert len(step_writes) == len(step.calls)
        for call, flags in zip(step.calls, step_writes):
            runs = call_runs(call, "qk"[side])
            assert len(flags[side]) == len(runs)
            for (a, b), write in zip(runs, flags[side]):  # in the order the fold runs
                assert write == (b > a and not touched[a:b].any()), (name, a, b)
                first_written[a:b] |= write
                touched[a:b] += 1
    assert fresh == (bool(first_written.all()) if rows else True), name


@pytest.mark.parametrize("name,plans", PLANS, ids=[n for n, _ in PLANS])
def test_a_run_is_written_exactly_when_its_rows_are_untouched(name, plans):
    for plan in plans:
        fwd, bwd = plan.forward, plan.backward
        _check_home(name, fwd.steps, fwd.writes, fwd.fresh[0], plan.rows, 0)
        assert all(f[1] == () for step in fwd.writes for f in step)
        if covers(fwd.steps[0].calls, plan.rows, "q"):
            assert fwd.fresh[0], "step 0 writing every row once is the old fresh"
        home = 1 if plan.key.backward == "burst" else 0
        _check_home(name, bwd.steps, bwd.writes, bwd.fresh[home], plan.rows, home)
        for i, (step, step_writes) in enumerate(zip(bwd.steps, bwd.writes)):
            travel = bwd.fresh[1 - home] if i == 0 else step.acc_fresh
            for call, flags in zip(step.calls, step_writes):  # the travelling side's rule
                assert flags[1 - home] == (travel,) * len(call_runs(call, "qk"[1 - home]))


def test_the_global_window_needs_no_fill_and_merges_fewer_rows():
    """The global window on 2 ranks: on rank 0 step 0 does not cover each row once (the band
    lies beside the global rows), yet on both ranks every row's first partial is written:
    no fill, and one partial a row is written instead of merged."""
    total = 256
    mask = mf.family("global_sliding_window", (total,), window=16, global_size=32)
    for r in range(2):
        plan = build_plan(plan_key("area", 2, (total,), mask, 1, RingKey((0, 1), r, None),
                                   "burst", dense_min_area=float("inf")))
        assert covers(plan.forward.steps[0].calls, plan.rows, "q") == (r == 1)
        assert plan.forward.fresh[0]
        rows = [(b - a, w) for s, fs in zip(plan.forward.steps, plan.forward.writes)
                for c, f in zip(s.calls, fs) for (a, b), w in zip(call_runs(c, "q"), f[0])]
        touched, merged = sum(n for n, _ in rows), sum(n for n, w in rows if not w)
        assert merged == touched - plan.rows  # each row written once, merged otherwise
        assert merged < touched  # before: every run merged (into filled accumulators)
