"""Slice masks that follow the data plan shape-free (issue 42's new-mask row).

cuDNN builds a graph per new block shape, so a mask that changes with every call must not
send its blocks there (``attention.varying_masks``). Checked here: the record's rules (the
first mask of a call shape plans as before, a second different one and every later mask go
shape-free; bounded), what the plans then hold (every block in a varlen call, none dense),
and that the answers stay exact on gloo ranks across a run of new masks (the float64 dense
reference, out, lse and every gradient).
"""
from __future__ import annotations

import random

import pytest

import megatron_burst as mb
from megatron_burst.attention import call_plan, prepare, varying_masks
from megatron_burst.plan import mask_families as mf

from .distributed import run_ranks
from .grid import reduce_errors
from .test_slice_masks import KNOBS, SEQ, TOL, random_mask, run_mask_case


def _mask(seed: int) -> mb.SliceMask:
    return random_mask(random.Random(seed), SEQ)


def test_the_first_mask_of_a_shape_keeps_its_plan_and_a_second_one_turns_it_shape_free():
    varying_masks.clear()
    a, b, c = _mask(1), _mask(2), _mask(3)
    assert a != b != c
    assert not varying_masks.follows_data("shape", a)
    assert not varying_masks.follows_data("shape", a)  # the same mask again: still fixed
    assert not varying_masks.follows_data("other shape", b)  # shapes are apart
    assert varying_masks.follows_data("shape", b)
    assert varying_masks.follows_data("shape", c)
    assert varying_masks.follows_data("shape", a)  # once it varies, every mask does
    varying_masks.clear()


def test_the_record_is_bounded():
    varying_masks.clear()
    for i in range(varying_masks.HISTORY + 10):
        varying_masks.follows_data(("shape", i), _mask(1))
    assert len(varying_masks._FIRST) == varying_masks.HISTORY
    assert ("shape", 0) not in varying_masks._FIRST  # the oldest went first
    varying_masks.clear()


def _plans_of(mask: mb.SliceMask) -> list[call_plan.CallPlan]:
    return [p for k, p in call_plan._PLANS.items() if k.mask == mask]


def new_masks_worker(rank, world, masks):
    """A run of calls on one shape, the first mask twice, then a new mask every call:
    (each call's errors, and per mask whether its plans were shape-free and all varlen)."""
    varying_masks.clear()
    call_plan.clear()
    prepare.PREPARED.clear()
    errors, plans = [], []
    for i, mask in enumerate([masks[0], *masks]):
        errors.append(run_mask_case(rank, world, 11 + i, mask=mask,
                                    backward=("burst", "ring")[i % 2]))
    for mask in masks:
        found = _plans_of(mask)
        launches = [c for p in found for c in p.calls]
        plans.append((sorted({p.key.dense_min_area is None for p in found}),
                      all(c.varlen for c in launches), bool(launches)))
    return errors, plans


@pytest.mark.parametrize("world", [1, 2])
def test_a_new_mask_every_call_plans_shape_free_and_stays_exact(world):
    masks = [mf.family("causal_document", (5, 17, 3, 11, 12), **KNOBS),
             mf.family("causal_document", (9, 9, 20, 10), **KNOBS), _mask(5), _mask(6)]
    results = run_ranks(world, new_masks_worker, masks)
    errors = reduce_errors([r[0] for r in results])
    bad = [f"call {i} {name}: {e:.3g}" for i, err in enumerate(errors)
           for name, e in err.items() if not e <= TOL]
    assert not bad, "\n".join(bad)
    for rank, (_, plans) in enumerate(results):
        first, *later = plans
        assert first[0] == [False], (rank, first)  # the first mask: the kernel's threshold
        for shape_free, all_varlen, any_launch in later:
            assert shape_free == [True], (rank, plans)
            assert all_varlen or not any_launch, (rank, plans)
