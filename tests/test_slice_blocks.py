"""``plan.cell_blocks.slice_blocks``, through its numpy passes and one triple at a time: the same
blocks, in the same order, as cutting each cell to each pair of segments and trimming it
with ``band_block`` one at a time (written again here as the reference), on random masks
and segments;
``trimmed_bands`` equal to ``band_block`` on random bands, unbounded ones included; and
``slice_rows`` (the rows a pair reads, without its blocks) equal to the blocks' rows joined,
alone and as ``RingSchedule.split_rows`` on every pair of every family's plan."""
from __future__ import annotations

import random

import numpy as np
import pytest

from megatron_burst.plan.blocks import INF
from megatron_burst.plan.segments import Segment
from megatron_burst.plan.cell_blocks import slice_blocks, slice_rows, trimmed_bands
from megatron_burst.plan.runs import merged
from megatron_burst.plan.slices import SliceMask, at_most_square, band_block

from .test_slice_masks import random_mask


def _one_at_a_time(q_segs, k_segs, mask: SliceMask) -> list:
    """The reference: every (query segment, key segment, cell) in that order, cut and
    trimmed by ``band_block``."""
    found = []
    for a in q_segs:
        qa, qb = a.pos, a.pos + a.valid
        for b in k_segs:
            ka, kb = b.pos, b.pos + b.valid
            for q0, q1, k0, k1, dlo, dhi in mask.cells.tolist():
                if not (q0 < qb and q1 > qa and k0 < kb and k1 > ka):
                    continue
                q0, q1, k0, k1 = max(q0, qa), min(q1, qb), max(k0, ka), min(k1, kb)
                off = q0 - k0
                blk = band_block(a.row + q0 - qa, q1 - q0, b.row + k0 - ka, k1 - k0,
                                 max(dlo, -INF) + off, min(dhi, INF) + off)
                if blk is not None:
                    found += at_most_square(blk)
    return found


def _random_segments(rng: random.Random, total: int) -> tuple:
    """Runs of positions cutting [0, total) in a random order, some ending in padding."""
    cuts = sorted(rng.sample(range(1, total), rng.randint(0, min(8, total - 1))))
    spans = list(zip([0, *cuts], [*cuts, total]))
    rng.shuffle(spans)
    segs, row = [], 0
    for a, z in spans[:rng.randint(1, len(spans))]:
        pad = rng.choice((0, 0, rng.randint(1, 3)))
        segs.append(Segment(row, 0, a, z - a + pad, z))  # valid: z - a; then padding
        row += z - a + pad
    return tuple(segs)


def _random_cases(seed: int, n: int = 400):
    """``n`` (mask, query segments, key segments) over random totals of up to 90."""
    rng = random.Random(seed)
    for _ in range(n):
        total = rng.randint(2, 90)
        mask = random_mask(rng, total)
        yield mask, _random_segments(rng, total), _random_segments(rng, total)


@pytest.mark.parametrize("few", [0, 10 ** 9])  # always the numpy passes; always one by one
def test_the_blocks_are_the_one_at_a_time_blocks_in_order(monkeypatch, few):
    from megatron_burst.plan import cell_blocks

    monkeypatch.setattr(cell_blocks, "_FEW_TRIPLES", few)
    made = 0
    for mask, q_segs, k_segs in _random_cases(11):
        want = _one_at_a_time(q_segs, k_segs, mask)
        assert slice_blocks(q_segs, k_segs, mask) == want
        made += len(want)
    assert made > 1500  # (the cases make blocks, not nothing)


def test_a_pass_too_big_for_one_numpy_pass_is_cut_and_gives_the_same(monkeypatch):
    from megatron_burst.plan import cell_blocks

    rng = random.Random(5)
    total = 64
    mask = random_mask(rng, total)
    q_segs, k_segs = _random_segments(rng, total), _random_segments(rng, total)
    monkeypatch.setattr(cell_blocks, "_FEW_TRIPLES", 0)
    whole = slice_blocks(q_segs, k_segs, mask)
    monkeypatch.setattr(cell_blocks, "_TRIPLES_AT_ONCE", 1)  # one query segment a pass
    assert slice_blocks(q_segs, k_segs, mask) == whole == _one_at_a_time(q_segs, k_segs, mask)


def _rows_of(blocks, side: str):
    return merged([(b.q_start, b.q_stop) if side == "q" else (b.k_start, b.k_stop)
                   for b in blocks])


def test_the_rows_without_blocks_are_the_blocks_rows_joined(monkeypatch):
    """Through the numpy passes (and None, the blocks to be made, where there are few)."""
    from megatron_burst.plan import cell_blocks

    q_segs = _random_segments(random.Random(1), 40)
    mask = random_mask(random.Random(2), 40)
    assert slice_rows(q_segs, q_segs, mask, "k") is None  # a few triples: make the blocks
    monkeypatch.setattr(cell_blocks, "_ROWS_ALONE_FROM", 0)
    runs = 0
    for mask, q_segs, k_segs in _random_cases(17):
        blocks = _one_at_a_time(q_segs, k_segs, mask)
        for side in "qk":
            want = _rows_of(blocks, side)
            assert slice_rows(q_segs, k_segs, mask, side) == want, (side, mask)
            runs += len(want)
    assert runs > 500


@pytest.mark.parametrize("world", [2, 4, 8])
def test_a_schedules_rows_are_the_same_with_or_without_its_blocks(monkeypatch, world):
    """``split_rows`` of a pair whose blocks are not made (``slice_rows``) and of one whose
    are (the blocks' rows joined): the same, every pair and side, every family and layout;
    so a plan's runs and reach do not depend on which pairs a rank made first."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from slice_masks import family_mask

    from megatron_burst.plan import cell_blocks, mask_families as mf
    from megatron_burst.plan.schedule import RingSchedule

    monkeypatch.setattr(cell_blocks, "_ROWS_ALONE_FROM", 0)  # every pair's rows alone
    pairs = [(q, k) for q in range(world) for k in range(world)]
    for name in mf.FAMILIES:
        total = 512 * world
        mask = family_mask(name, total, 512 / 8192)
        for layout in ("area", "zigzag"):
            lazy, made = (RingSchedule(layout, world, (total,), mask) for _ in range(2))
            for q, k in pairs:
                made.split_blocks(q, k)
            for q, k in pairs:
                for side in "qk":
                    assert lazy.split_rows(q, k, side) == made.split_rows(q, k, side) == \
                        _rows_of(made.split_blocks(q, k), side), (name, layout, q, k, side)


def test_a_side_that_is_neither_q_nor_k_is_refused():
    from megatron_burst.plan.schedule import RingSchedule

    sched = RingSchedule("area", 2, (64,), random_mask(random.Random(4), 64))
    with pytest.raises(ValueError, match="split_rows: side must be 'q' or 'k', got 'v'"):
        sched.split_rows(0, 1, "v")


def test_trimmed_bands_is_band_block_on_arrays():
    rng = random.Random(3)
    args = []
    for _ in range(5000):
        nq, nk = rng.randint(-1, 12), rng.randint(-1, 12)
        lo = rng.choice((-INF + rng.randint(-20, 20), rng.randint(-15, 15)))
        hi = rng.choice((INF + rng.randint(-20, 20), lo + rng.randint(-3, 20)))
        args.append((rng.randint(0, 50), nq, rng.randint(0, 50), nk, lo, hi))
    want = []
    for a in args:
        blk = band_block(*a)
        if blk is not None:
            want.append([blk.q_start, blk.q_stop, blk.k_start, blk.k_stop,
                         ("full", "causal", "band").index(blk.kind), blk.lo, blk.hi])
    got = trimmed_bands(*(np.array(column, dtype=np.int64) for column in zip(*args)))
    assert got == want and len(want) > 1000


def test_the_planning_benchmark_times_every_family_and_names_its_package(tmp_path):
    """``benchmarks/slice_plan_cpu.py`` on 2 ranks: a row per family, each rank's time."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "benchmarks" / "slice_plan_cpu.py"
    done = subprocess.run([sys.executable, str(script), "--worlds", "2", "--repeat", "1",
                           "--tokens", "1024", "--out", str(tmp_path / "plans")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    run = json.loads((tmp_path / "plans.json").read_text())
    from megatron_burst.plan import mask_families as mf

    assert [r["family"] for r in run["rows"]] == list(mf.FAMILIES)
    assert all(r["rank0_ms"] > 0 and r["rank1_ms"] > 0 for r in run["rows"])
    assert run["meta"]["package"].endswith("megatron_burst")
