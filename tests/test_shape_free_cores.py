"""A shape-free plan's large blocks carved into cores of few shapes (``blocks.carved``).

A slice mask that changes from call to call plans shape-free: cuDNN would build a graph for
every new block shape. Its full and causal blocks are carved into cores whose sides are the
grain times a power of two (each a dense call: few shapes whatever the mask) and strips that
go varlen. Checked here: every visible pair of a block lies in exactly one piece, counted
pair by pair; the cores' sides; the plans of new masks hold such cores and nothing else
dense; and the calls stay exact against the float64 dense reference on gloo ranks (out,
lse and every gradient) with the grain set small enough to carve the test's masks. A ring's
plan carves too (``thresholds.CARVE_RINGS``, on since rings carved ran faster on 2x H200 once
their graphs were built); switched off, its plans hold no cores, exact either way.
"""
from __future__ import annotations

import itertools
import random

import pytest

from megatron_burst.attention import call_plan, prepare, varying_masks
from megatron_burst.kernels import thresholds
from megatron_burst.plan import mask_families as mf
from megatron_burst.plan.blocks import Block, carved

from .distributed import run_ranks
from .grid import reduce_errors
from .test_slice_masks import KNOBS, SEQ, TOL, random_mask, run_mask_case


def _pairs(b: Block) -> set[tuple[int, int]]:
    """The visible (query, key) rows of ``b``, one by one."""
    out = set()
    for i, j in itertools.product(range(b.q_start, b.q_stop), range(b.k_start, b.k_stop)):
        if b.kind == "full" or (b.kind == "causal" and j - b.k_start <= i - b.q_start):
            out.add((i, j))
    return out


def _is_side(n: int, grain: int) -> bool:
    return n % grain == 0 and (n // grain) & (n // grain - 1) == 0


@pytest.mark.parametrize("grain", [1, 2, 3, 4, 8])
def test_every_pair_lies_in_exactly_one_piece_and_cores_have_few_shapes(grain):
    rng = random.Random(grain)
    blocks = [Block(3, 3 + n, 5, 5 + n, "causal") for n in range(1, 40)]
    blocks += [Block(0, rng.randint(1, 40), 7, 7 + rng.randint(1, 40)) for _ in range(40)]
    for block in blocks:
        cores, rest = carved(block, grain)
        pieces = [*cores, *rest]
        seen = [p for piece in pieces for p in _pairs(piece)]
        assert len(seen) == len(set(seen)) == block.area, block  # once each, no more
        assert set(seen) == _pairs(block), block
        assert sum(p.area for p in pieces) == block.area
        for core in cores:
            assert core.kind in ("full", "causal") and core.area > 0
            assert _is_side(core.q_stop - core.q_start, grain), (block, core)
            assert _is_side(core.k_stop - core.k_start, grain), (block, core)
        for piece in rest:  # what is left is narrower than the grain
            assert min(piece.q_stop - piece.q_start, piece.k_stop - piece.k_start) < grain


def test_a_block_below_the_grain_and_a_band_stay_whole():
    small, band = Block(0, 7, 0, 9), Block(0, 40, 0, 40, "band", -3, 2)
    assert carved(small, 8) == ([], [small])
    assert carved(band, 8) == ([], [band])
    cores, rest = carved(Block(0, 24, 0, 24, "causal"), 8)  # 24 = 16 + 8: two cores
    assert sorted((c.q_stop - c.q_start, c.kind) for c in cores) == [
        (8, "causal"), (16, "causal"), (16, "full")]
    assert rest == []


def carving_worker(rank, world, masks, grain, rings, topology=None):
    """A new mask every call, with the shape-free grain at ``grain`` (and a ring's plan
    carving too where ``rings``), each call under ``topology`` (burst_attn's Ulysses or
    double-ring options): (each call's errors, and per shape-free plan its dense calls'
    blocks)."""
    thresholds.SHAPE_FREE_GRAIN = grain  # this rank's process: read by every plan key
    thresholds.CARVE_RINGS = rings
    varying_masks.clear()
    call_plan.clear()
    prepare.PREPARED.clear()
    errors = [run_mask_case(rank, world, 21 + i, mask=mask, backward=("burst", "ring")[i % 2],
                            **(topology or {}))
              for i, mask in enumerate(masks)]
    dense = []
    for key, plan in call_plan._PLANS.items():
        if key.dense_min_area is None:
            assert key.grain == (grain if key.ring is None or rings else None)
            dense.append([(c.blocks[0].kind, c.blocks[0].q_stop - c.blocks[0].q_start,
                           c.blocks[0].k_stop - c.blocks[0].k_start)
                          for c in plan.calls if not c.varlen])
    return errors, dense


def _new_masks(rng: random.Random) -> list:
    return [mf.family("causal_document", (5, 17, 3, 11, 12), **KNOBS),
            mf.family("causal_document", (9, 9, 20, 10), **KNOBS),
            mf.family("shared_question", (6, 14, 9, 19), **KNOBS),
            mf.family("causal_blockwise", (12, 20, 16), **KNOBS),
            random_mask(rng, SEQ), random_mask(rng, SEQ)]


@pytest.mark.parametrize("world,rings", [(1, False), (2, False), (2, True), (3, True)])
def test_new_masks_with_carved_cores_stay_exact(world, rings):
    rng, grain = random.Random(world), 4
    results = run_ranks(world, carving_worker, _new_masks(rng), grain, rings)
    errors = reduce_errors([r[0] for r in results])
    bad = [f"call {i} {name}: {e:.3g}" for i, err in enumerate(errors)
           for name, e in err.items() if not e <= TOL]
    assert not bad, "\n".join(bad)
    for rank, (_, dense) in enumerate(results):
        shapes = [s for plan in dense for s in plan]
        # A single member's plans carve some cores; a ring's none when switched off.
        assert bool(shapes) == (world == 1 or rings), (rank, dense)
        for kind, n, m in shapes:
            assert kind in ("full", "causal") and _is_side(n, grain) and _is_side(m, grain)


@pytest.mark.parametrize("world,topology", [(2, dict(ulysses_size=2)),
                                            (4, dict(ulysses_size=2)),
                                            (4, dict(intra_node_size=2))])
def test_carved_cores_stay_exact_under_ulysses_and_the_double_ring(world, topology):
    """Ulysses' members and the double ring's plan their blocks through the same key: new
    masks carved there stay exact against float64 too, and some plans hold cores."""
    results = run_ranks(world, carving_worker, _new_masks(random.Random(7)), 4, True,
                        topology)
    errors = reduce_errors([r[0] for r in results])
    bad = [f"call {i} {name}: {e:.3g}" for i, err in enumerate(errors)
           for name, e in err.items() if not e <= TOL]
    assert not bad, "\n".join(bad)
    assert any(shapes for _, dense in results for shapes in dense), results


def test_the_grain_is_part_of_a_shape_free_key_only(monkeypatch):
    mask = mf.family("causal_document", (5, 17, 3, 11, 12), **KNOBS)
    ring = call_plan.RingKey((0, 1), 0, None)

    def key(world, ring, **kw):
        return call_plan.plan_key("area", world, (SEQ,), mask, 1, ring, "ring", **kw)

    assert key(1, None, dense_min_area=None).grain == thresholds.SHAPE_FREE_GRAIN
    assert key(1, None, dense_min_area=2.0).grain is None
    assert key(1, None, batch=2, dense_min_area=None).grain is None
    assert thresholds.CARVE_RINGS  # the package's default: a ring carves too
    assert key(2, ring, dense_min_area=None).grain == thresholds.SHAPE_FREE_GRAIN
    assert key(2, ring, dense_min_area=2.0).grain is None
    monkeypatch.setattr(thresholds, "CARVE_RINGS", False)
    assert key(2, ring, dense_min_area=None).grain is None  # switched off: not carved


def test_a_block_of_a_longer_buffer_reaches_cudnn_with_its_own_batch_stride():
    """PyTorch keys cuDNN's graphs by strides: a block cut from buffers of two lengths must
    reach it alike (``cuda._batch_strided``), as a view of the same values."""
    import torch

    from megatron_burst.kernels.cuda import _batch_strided

    views = []
    for n in (40, 56):
        buf = torch.arange(n * 3 * 4, dtype=torch.float32).reshape(1, n, 3, 4)
        block = buf[:, 8:24]
        got = _batch_strided(block)
        assert torch.equal(got, block) and got.data_ptr() == block.data_ptr()
        views.append(got.stride())
    assert views[0] == views[1] == (16 * 12, 12, 4, 1)
    two = torch.zeros(2, 5, 3, 4)[:, 1:3]  # a batch of two reads its batch stride: kept
    assert _batch_strided(two).stride() == two.stride()
