"""A dense threshold per pass (``call_plan.build_plan``): a ring's forward keeps the kernel's
``dense_min_area``, its backward and a single member's passes take ``gpu_bound_min_area``.

The plans are checked pass by pass against the plans of one threshold (the forward as with
the first, the backward as with the second, a single member's both as with the second), and
the call is exact against the float64 reference on 1-4 CPU ranks with the two thresholds
apart, both backwards, GQA, sbhd and a batch of two; on 4 ranks also windows (passes of two
rounds), the double ring and Ulysses.
"""
from __future__ import annotations

import math

import pytest

from megatron_burst.attention.call_plan import RingKey, build_plan, plan_key
from megatron_burst.plan import mask_families as mf

from .distributed import run_ranks
from .grid import reduce_errors
from .test_slice_masks import KNOBS, LENS, SEQ, TOL, random_mask, run_mask_case

INF = float("inf")
SMALL = 20.0  # visible pairs: the families' blocks on LENS straddle it


def _plan(name: str, world: int, rank: int, backward: str, dense: float, gpu: float | None):
    ring = RingKey(tuple(range(world)), rank, None) if world > 1 else None
    return build_plan(plan_key("area", world, (SEQ,), mf.family(name, LENS, **KNOBS), 1, ring,
                               backward, dense_min_area=dense, gpu_bound_min_area=gpu))


def _calls(pass_) -> list:
    """A pass's kernel calls step by step, by value."""
    return [(s.source, [(c.varlen, c.blocks) for c in s.calls]) for s in pass_.steps]


@pytest.mark.parametrize("backward", ["ring", "burst"])
@pytest.mark.parametrize("name,world", [
    (name, world) for world in (2, 3) for name in (
        "causal_document", "block_causal_document", "shared_question", "full_document")] + [
    ("sliding_window", 4), ("causal_document", 4)])  # 4 ranks: the window's two rounds
def test_a_ring_plans_its_forward_and_backward_each_by_its_threshold(name, world, backward):
    moved = False
    for rank in range(world):
        split = _plan(name, world, rank, backward, INF, SMALL)
        host, gpu = (_plan(name, world, rank, backward, t, None) for t in (INF, SMALL))
        assert _calls(split.forward) == _calls(host.forward)
        assert _calls(split.backward) == _calls(gpu.backward)
        # What the backward writes first and sends is its own calls' (not the forward's).
        for field in ("writes", "fresh", "uses", "wire", "home_from_first"):
            assert getattr(split.backward, field) == getattr(gpu.backward, field), field
        assert {id(c) for c in split.calls} >= {id(c) for s in split.backward.steps
                                                for c in s.calls}
        moved |= _calls(host.backward) != _calls(gpu.backward)
    assert moved  # the thresholds differ somewhere, or the test proves nothing


@pytest.mark.parametrize("name", ["causal_document", "block_causal_document"])
def test_a_single_member_plans_both_passes_by_the_gpu_s_threshold(name):
    split = _plan(name, 1, 0, "ring", INF, SMALL)
    host, gpu = (_plan(name, 1, 0, "ring", t, None) for t in (INF, SMALL))
    assert _calls(split.forward) == _calls(gpu.forward) != _calls(host.forward)
    assert _calls(split.backward) == _calls(gpu.backward)


def test_one_threshold_is_kept_as_one():
    mask = mf.family("causal_document", LENS, **KNOBS)
    ring = RingKey((0, 1), 0, None)
    same = plan_key("area", 2, (SEQ,), mask, 1, ring, "ring", dense_min_area=SMALL,
                    gpu_bound_min_area=SMALL)
    assert same.gpu_bound_min_area is None
    assert same == plan_key("area", 2, (SEQ,), mask, 1, ring, "ring", dense_min_area=SMALL)
    # Shape-free plans (every block varlen) have no threshold to split.
    assert plan_key("area", 2, (SEQ,), mask, 1, ring, "ring", dense_min_area=None,
                    gpu_bound_min_area=SMALL).gpu_bound_min_area is None
    plan = build_plan(same)
    assert all(f.calls is b.calls for f, b in zip(plan.forward.steps, plan.backward.steps))


def split_worker(rank, world, cases):
    from megatron_burst.attention import call_plan, prepare
    from megatron_burst.kernels.reference import ReferenceAttention

    ReferenceAttention.dense_min_area = INF  # (this rank's process only)
    ReferenceAttention.gpu_bound_min_area = SMALL
    call_plan.clear()
    prepare.PREPARED.clear()
    return [run_mask_case(rank, world, i * 7919 + world, kernel="reference", **case)
            for i, case in enumerate(cases)]


FOUR = (("sliding_window", "ring", {}),  # a window on 4 ranks: passes of two rounds
        ("sliding_window_causal", "burst", {}),
        ("causal_document", "ring", dict(intra_node_size=2)),  # the double ring
        ("shared_question", "burst", dict(ulysses_size=2)))  # Ulysses x ring


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_the_call_is_exact_with_the_thresholds_apart(world):
    import random

    rng = random.Random(7 + world)
    named = (("causal_document", "ring", {}),
             ("block_causal_document", "burst", dict(fmt="sbhd")),
             ("shared_question", "ring", dict(hkv=1)),
             ("full_document", "burst", dict(b=2))) + (FOUR if world == 4 else ())
    cases = [dict(mask=mf.family(name, LENS, **KNOBS), backward=mode, **extra)
             for name, mode, extra in named]
    cases += [dict(mask=random_mask(rng, SEQ), backward=mode) for mode in ("ring", "burst")]
    errors = reduce_errors(run_ranks(world, split_worker, cases))
    bad = [f"case {i} {n}: {e:.3g}" for i, err in enumerate(errors) for n, e in err.items()
           if not e <= TOL or math.isnan(e)]
    assert not bad, "\n".join(bad)


def test_a_large_call_s_ring_forward_takes_the_gpu_s_threshold():
    """``thresholds.forward_min_area``: a call whose queries exceed the host-bound size (the
    issue's 8K tokens of 64 heads of 128 do) plans its ring forward with the GPU's threshold;
    at the line or below, and for a kernel of one threshold, the kernel's own."""
    from types import SimpleNamespace

    from megatron_burst.kernels.thresholds import HOST_BOUND_MAX_ELEMENTS, forward_min_area

    split = SimpleNamespace(dense_min_area=2.0, gpu_bound_min_area=1.0)
    assert forward_min_area(split, HOST_BOUND_MAX_ELEMENTS) == 2.0
    assert forward_min_area(split, HOST_BOUND_MAX_ELEMENTS + 1) == 1.0
    one = SimpleNamespace(dense_min_area=2.0, gpu_bound_min_area=None)
    assert forward_min_area(one, 1 << 40) == 2.0
    assert 8192 * 64 * 128 > HOST_BOUND_MAX_ELEMENTS >= 8192 * 16 * 128


def size_worker(rank, world, line, cases):
    """The thresholds apart on the reference kernel, the host-bound line at ``line`` query
    elements: each case's errors, and the thresholds of every plan the calls made."""
    from megatron_burst.attention import call_plan, prepare
    from megatron_burst.kernels import thresholds
    from megatron_burst.kernels.reference import ReferenceAttention

    ReferenceAttention.dense_min_area = INF  # (this rank's process only)
    ReferenceAttention.gpu_bound_min_area = SMALL
    thresholds.HOST_BOUND_MAX_ELEMENTS = line
    call_plan.clear()
    prepare.PREPARED.clear()
    errors = [run_mask_case(rank, world, i * 31 + world, kernel="reference", **case)
              for i, case in enumerate(cases)]
    # (a later mask of one call shape plans shape-free, with no threshold: ``varying_masks``)
    keys = {(k.dense_min_area, k.gpu_bound_min_area) for k in call_plan._PLANS
            if k.dense_min_area is not None}
    return errors, sorted(keys, key=repr)


@pytest.mark.parametrize("line,planned", [(0, [(SMALL, None)]), (1 << 40, [(INF, SMALL)])])
def test_a_call_above_the_host_bound_line_plans_one_threshold_and_is_exact(line, planned):
    cases = [dict(mask=mf.family(name, LENS, **KNOBS), backward=mode)
             for name, mode in (("causal_document", "ring"), ("block_causal_document", "burst"),
                                ("shared_question", "burst"))]
    got = run_ranks(2, size_worker, line, cases)
    assert all(keys == planned for _, keys in got), [keys for _, keys in got]
    errors = reduce_errors([errs for errs, _ in got])
    bad = [f"case {i} {n}: {e:.3g}" for i, err in enumerate(errors) for n, e in err.items()
           if not e <= TOL or math.isnan(e)]
    assert not bad, "\n".join(bad)
