"""A forward's few rows that take more than two partials, kept apart in fp32.

In half precision a home row that takes at most two partials is exact in the inputs' dtype
(the fused merge computes in fp32 and rounds once); a row that takes more needs an fp32
accumulator. Where at most half the rows take more than two (``plan.blocks.rows_over``,
``PassPlan.wide_rows``), the home stays in half precision and only those rows accumulate
in an fp32 buffer (``home_output.WideRows``), cast into the home at the end; before, the
whole home was fp32, with a conversion each way for every row.

Checked here: the runs (against a count per row), their cuts, which passes keep rows apart,
and, on 2 and 3 gloo ranks in bf16 with the fused merge's rule emulated on the CPU (fp32,
rounded once as stored), that out, lse and every gradient are the same bits as with the
whole home in fp32, and within bf16 accuracy of float64.
"""
from __future__ import annotations

import random

import pytest
import torch

import megatron_burst as mb
from megatron_burst.attention.call_plan import RingKey, build_plan, plan_key
from megatron_burst.attention.home_output import WideRows, forward_home
from megatron_burst.plan import mask_families as mf
from megatron_burst.plan.blocks import rows_over

from .distributed import run_ranks
from .patching import swap
from .reference import reference_attention, slice_allowed


def _counted(spans, most: int, n: int) -> set:
    count = [0] * n
    for a, b in spans:
        for i in range(a, b):
            count[i] += 1
    return {i for i in range(n) if count[i] > most}


def test_the_runs_are_the_rows_counted_more_than_twice():
    rng = random.Random(7)
    for _ in range(300):
        n = rng.randint(1, 40)
        spans = []
        for _ in range(rng.randint(0, 8)):
            a = rng.randint(0, n - 1)
            spans.append((a, rng.randint(a, n)))
        runs = rows_over(spans, 2)
        assert {i for a, b in runs for i in range(a, b)} == _counted(spans, 2, n), spans
        assert all(a < b for a, b in runs)
        assert all(x[1] < y[0] for x, y in zip(runs, runs[1:])), runs  # disjoint, apart


def test_a_run_of_rows_is_cut_where_the_kept_rows_start_and_stop():
    out = torch.empty(1, 64, 2, 4, dtype=torch.bfloat16)
    wide = WideRows(((10, 20), (30, 34)), out, fresh=True)
    assert wide.buf.shape == (1, 24, 2, 4) and wide.buf.dtype == torch.float32
    assert wide.pieces(0, 64) == [(0, 10, False), (10, 20, True), (20, 30, False),
                                  (30, 34, True), (34, 64, False)]
    assert wide.pieces(12, 31) == [(12, 20, True), (20, 30, False), (30, 31, True)]
    assert wide.pieces(20, 30) == [(20, 30, False)]
    assert wide.pieces(15, 18) == [(15, 18, True)]
    assert wide.rows(30, 34).data_ptr() == wide.buf[:, 20:24].data_ptr()
    # where each piece folds: the kept rows at their place in the fp32 buffer, the rest home
    assert [(t is wide.buf, at, x, y) for t, at, x, y in wide.targets(out, 12, 31)] == [
        (True, 2, 12, 20), (False, 20, 20, 30), (True, 20, 30, 31)]
    assert all(t is out for t, *_ in wide.targets(out, 20, 30))


def _forward(world: int, mask, rank: int):
    total = mask.q_ranges[-1][1]
    key = plan_key("area", world, (total,), mask, 1, RingKey(tuple(range(world)), rank, None),
                   "ring")
    plan = build_plan(key)
    return plan.forward, plan.rows


# (family, document lengths, ranks): each keeps rows apart on some rank, from a home made
# before the first call and from the first call's output, in one run or two.
CASES = [("causal_blockwise", (17, 45, 30, 52, 48), 2), ("global_sliding_window",
                                                          (40, 30, 60, 20, 42), 2),
         ("causal_blockwise", (40, 30, 60, 20, 42), 3)]


def _mask(name: str, lens: tuple) -> mb.SliceMask:
    return mf.family(name, lens, prefix=sum(lens) // 4, window=16, global_size=16, block=16)


def test_which_passes_keep_rows_apart():
    seen = set()
    for name, lens, world in CASES:
        for rank in range(world):
            forward, rows = _forward(world, _mask(name, lens), rank)
            home, wide = forward_home(forward, torch.bfloat16, True, rows)
            assert wide == forward.wide_rows and home == torch.bfloat16
            seen.add((forward.home_from_first, len(wide)))
            # fp32 inputs, or no fused merge: the home is fp32 and nothing is kept apart
            assert forward_home(forward, torch.float32, True, rows) == (torch.float32, ())
            assert forward_home(forward, torch.bfloat16, False, rows) == (torch.float32, ())
    assert seen == {(True, 1), (False, 1), (True, 2)}, seen
    # more than half the rows: the whole home in fp32, as before
    forward, rows = _forward(2, _mask("shared_question", (40, 30, 60, 20, 42)), 0)
    assert forward.uses[0] > 2 and forward_home(forward, torch.bfloat16, True, rows) == (
        torch.float32, ())


def _worker(rank: int, world: int, name: str, lens: tuple, backward: str, gpu: bool = False,
            interpreted: bool = False):
    """Both homes' (out, dq, dk, dv, lse), gathered, and how many ``WideRows`` were made.
    On CPU the fused merge is emulated; ``gpu``: rank r on GPU r, the fused kernel itself;
    ``interpreted``: on CPU, the fused kernel itself under Triton's interpreter
    (``tests/fused_ring_interpreted.py``; every rank must have launched it)."""
    from megatron_burst.attention import burst, home_output
    from megatron_burst.kernels import merge

    def fused(out, lse, block_out, block_lse):
        """The fused kernel's rule: each row in fp32, rounded once as stored. Computed in
        float64 and rounded to fp32, so a row's result depends on its values alone (torch's
        CPU exp differs by an ulp between its vector body and a tensor's tail)."""
        acc, lse64 = out.double(), lse.double()
        merge.merge_partial_torch(acc, lse64, block_out, block_lse.double())
        out.copy_(acc.float())
        lse.copy_(lse64.float())

    made = []

    class Counted(WideRows):
        def __init__(self, *args):
            made.append(1)
            super().__init__(*args)

    real = burst.forward_home

    def whole_fp32(plan, dtype, fuses, rows):  # before: the whole home fp32 where needed
        home, wide = real(plan, dtype, fuses, rows)
        return (torch.float32 if wide else home), ()

    dev = torch.device("cuda", rank) if gpu else torch.device("cpu")
    mask, (q, do, k, v) = inputs(name, lens, world)
    q, do, k, v = (t.to(dev) for t in (q, do, k, v))
    # (made by the ring, or with a home from the first call(s), ``home_output.first_home``)
    patches, launched = [(burst, "WideRows", Counted), (home_output, "WideRows", Counted)], []
    if interpreted:  # the kernel's own rule on CPU tensors: Triton's interpreter runs it
        launch = merge._launch
        patches += [(burst, "fuses", _fuses_on_cpu), (merge, "fuses", _fuses_on_cpu),
                    (merge, "_launch", lambda *a, **kw: launched.append(1) or launch(*a, **kw))]
    elif not gpu:
        patches += [(burst, "fuses", lambda *a: True), (merge, "merge_partial", fused)]
    olds = {(m, n): swap(m, n, x) for m, n, x in patches}
    try:
        got = []
        for home in (real, whole_fp32):
            swap(burst, "forward_home", home)
            local = [mb.shard_seq(t, mask=mask).requires_grad_() for t in (q, k, v)]
            out, lse = mb.burst_attn(*local, mask=mask, backward=backward, return_lse=True)
            out.backward(mb.shard_seq(do, mask=mask))
            got.append([mb.unshard_seq(t.detach(), mask=mask).cpu() for t in (
                out, *[x.grad for x in local])]
                       + [mb.unshard_seq(lse.detach(), seq_dim=2, mask=mask).cpu()])
    finally:
        swap(burst, "forward_home", real)
        for (m, n), old in olds.items():
            swap(m, n, old)
    if interpreted and not launched:
        raise AssertionError(f"rank {rank}: the fused kernel never ran (the torch merge did)")
    return got, len(made)


def _fuses_on_cpu(device, dtype, head_dim) -> bool:
    """``merge.fuses`` with the CPU admitted (Triton's interpreter)."""
    from megatron_burst.kernels import merge

    return dtype in merge._FUSED_DTYPES and head_dim & (head_dim - 1) == 0


def inputs(name: str, lens: tuple, world: int) -> tuple:
    """The mask, and the inputs every rank of ``_worker`` draws (on the CPU)."""
    mask, total = _mask(name, lens), sum(lens)
    gen = torch.Generator().manual_seed(11 + world)
    return mask, [torch.randn(1, total, h, 16, generator=gen).bfloat16() for h in (4, 4, 2, 2)]


def check_against_whole_and_float64(results: list, name: str, lens: tuple, world: int,
                                    same_bits: bool = True) -> None:
    """Some rank kept rows apart; its out, lse and gradients are the bits of a whole fp32
    home (``same_bits``: not under Triton's interpreter, which rounds to bf16 by truncation
    where torch's cast rounds to nearest), and within bf16 accuracy of float64."""
    assert sum(n for _, n in results) >= 1
    (apart, whole), _ = results[0]
    for a, w, what in zip(apart, whole, ("out", "dq", "dk", "dv", "lse")):
        assert torch.equal(a, w) or not same_bits, what
    mask, (q, do, k, v) = inputs(name, lens, world)
    leaves = [t.double().requires_grad_() for t in (q, k, v)]
    allowed = slice_allowed(q.shape[1], mask.q_ranges, mask.k_ranges, mask.kinds)
    ref, _ = reference_attention(*leaves, causal=False, scale=0.25, allowed=allowed)
    ref.backward(do.double())
    for got in (apart, whole):
        for mine, want in zip(got[:4], [ref, *[t.grad for t in leaves]]):
            err = ((mine.double() - want).norm() / want.norm()).item()
            assert err < 2e-2, err  # NaN fails too


@pytest.mark.parametrize("case", range(len(CASES)))
def test_rows_kept_apart_give_the_bits_of_a_whole_fp32_home(case):
    name, lens, world = CASES[case]
    backward = ("ring", "burst")[case % 2]
    check_against_whole_and_float64(run_ranks(world, _worker, name, lens, backward), name,
                                    lens, world)


def _merges(rank: int, world: int, name: str):
    """Merge launches of one forward at 8K tokens a rank (slice_masks.py's mask), with rows
    kept apart and with the whole home in fp32 (the fused merge emulated, as above)."""
    import sys
    import zlib

    from megatron_burst.attention import burst, home_output
    from megatron_burst.kernels import merge

    from .readme import REPO

    sys.path.insert(0, str(REPO / "benchmarks"))
    from slice_masks import knobs, pile_like

    total = 8192 * world
    mask = mf.family(name, pile_like(total, seed=zlib.crc32(name.encode())), **knobs(total, 1.0))
    q, k, v = (mb.shard_seq(torch.randn(1, total, h, 16).bfloat16(), mask=mask) for h in (2, 1, 1))
    count = [0]

    def fused(out, lse, block_out, block_lse):
        count[0] += 1
        acc, lse64 = out.double(), lse.double()
        merge.merge_partial_torch(acc, lse64, block_out, block_lse.double())
        out.copy_(acc.float())
        lse.copy_(lse64.float())

    real = burst.forward_home
    olds = [(burst, "fuses", swap(burst, "fuses", lambda *a: True)),
            (merge, "merge_partial", swap(merge, "merge_partial", fused))]
    got = []
    try:
        for home in (real, lambda p, d, f, r: ((torch.float32 if real(p, d, f, r)[1]
                                                else real(p, d, f, r)[0]), ())):
            swap(burst, "forward_home", home)
            count[0] = 0
            with torch.no_grad():
                mb.burst_attn(q, k, v, mask=mask, backward="ring")
            got.append(count[0])
    finally:
        swap(burst, "forward_home", real)
        for m, n, old in olds:
            swap(m, n, old)
    return got


def test_rows_kept_apart_cost_merge_launches_where_they_cut_runs():
    """The cost the README gives: a query run cut at the kept rows folds piece by piece, so
    shared question's rank 0 makes 6 merge launches a forward where the whole fp32 home
    made 3; causal blockwise's kept rows fall on whole runs, and cost none."""
    from .readme import says

    shared = run_ranks(2, _merges, "shared_question")
    blockwise = run_ranks(2, _merges, "causal_blockwise")
    assert shared == [[6, 3], [3, 2]], shared
    assert blockwise == [[3, 3], [1, 1]], blockwise  # ([[4, 4], [2, 2]] in even chunks)
    says("shared question's rank 0 makes 6 merge launches a forward where it made 3")
