"""Layout ``pack_zigzag``: documents the GPU reads (``kernels.device_calls``), exact.

``burst_attn`` on 1-4 gloo ranks against the float64 reference (out, lse, dq, dk, dv): packs
of many tiny documents, one long one, empty documents (boundaries padded by repeating the
last), documents that cross every chunk edge; causal and full, MHA/GQA/MQA, both backwards,
both formats, a double ring. Then what the layout promises: a new pack plans nothing on the
host, boundaries that are malformed or differ between ranks raise the same ValueError on
every rank (at the call after: they are checked on the device), and what it cannot take
raises.
"""
from __future__ import annotations

import itertools
import random

import pytest
import torch

import megatron_burst as mb

from .distributed import run_ranks
from .grid import check_grid
from .packs import random_pack


def _cases(world: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    cases = []
    shapes = [(4, 4), (4, 2), (4, 1)]
    for (causal, backward), kind in itertools.product(
            itertools.product((True, False), ("ring", "burst")), ("tiny", "huge", "mix")):
        hq, hkv = rng.choice(shapes)
        lens = random_pack(rng, 2 * world * rng.randint(40, 80), kind)
        cases.append(dict(layout="pack_zigzag", causal=causal, backward=backward, hq=hq,
                          hkv=hkv, d=16, dtype=torch.float32, doc_lens=lens,
                          fmt=rng.choice(("bshd", "sbhd"))))
    return cases


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_random_packs_match_float64_reference(world):
    check_grid(world, _cases(world, world))


def test_packs_on_a_double_ring_match_float64_reference():
    cases = [dict(c, intra_node_size=2) for c in _cases(4, 40)[:6]]
    check_grid(4, cases)


def test_packs_on_ulysses_members_match_float64_reference():
    cases = [dict(c, ulysses_size=2) for c in _cases(4, 41)[:6]]
    check_grid(4, cases)


# ------------------------------------------------------------------ what the layout promises

def _host_work(rank: int, world: int) -> dict:
    """Python calls of a CP=2 fwd+bwd in pack_zigzag: a new pack against the same pack."""
    from .test_host_path import profiled

    s = 128
    gen = torch.Generator().manual_seed(rank)
    q, k, v = (torch.randn(1, s, h, 16, generator=gen, requires_grad=True) for h in (4, 2, 2))
    do = torch.randn(1, s, 4, 16, generator=gen)
    packs = iter(range(1000))

    def pack():
        cut = torch.Generator().manual_seed(next(packs))
        cuts = sorted((torch.randperm(s * world - 1, generator=cut)[:7] + 1).tolist())
        return torch.tensor([0, *cuts, s * world], dtype=torch.int32)

    def call(cu):
        mb.burst_attn(q, k, v, causal=True, layout="pack_zigzag", cu_seqlens=cu,
                      backward="ring").backward(do)

    same = pack()
    for _ in range(3):
        call(pack())
    counts, names = {}, {}
    for label, make in (("same", lambda: same), ("new", pack)):
        seen: dict = {}

        def hook(frame, event, arg, seen=seen):
            # The package's own Python, but the CPU kernels' loop over the sequences and
            # their blocks (on CUDA one launch; here one dense call per document the pack
            # happens to have).
            path = frame.f_code.co_filename
            if event == "call" and "/megatron_burst/" in path and not path.endswith(
                    ("/plan/blocks.py",)) and "/kernels/" not in path:
                seen[frame.f_code.co_name] = seen.get(frame.f_code.co_name, 0) + 1
            elif event == "c_call" and getattr(arg, "__name__", "") in ("tolist", "item"):
                seen[arg.__name__] = seen.get(arg.__name__, 0) + 1  # (the gloo check's)

        cu = make()
        profiled(lambda: call(cu), hook)
        counts[label], names[label] = sum(seen.values()), dict(seen)
    return counts, names


def test_a_new_pack_costs_the_host_what_the_same_pack_does():
    """No planning, no placement, no read of the boundaries: a new pack is the same Python
    work, call for call, as the pack before (the kernels read the boundaries on the device;
    on gloo the boundaries' check reads its gathered verdict, as for any pack)."""
    for counts, names in run_ranks(2, _host_work, timeout=300):
        assert names["new"] == names["same"], (counts, names)
        assert not set(names["new"]) & {"build_plan", "prepare", "pack_documents",
                                        "placement", "pair_launches", "plan_calls",
                                        "describe_lengths"}, names


def _bad_boundaries(rank: int, world: int, case: str) -> str:
    s = 32
    q, k, v = (torch.randn(1, s, 2, 8) for _ in range(3))
    good = torch.tensor([0, 10, 40, s * world], dtype=torch.int32)
    cu = {"decreasing": torch.tensor([0, 40, 10, s * world], dtype=torch.int32),
          "short": torch.tensor([0, 10, 40, s * world - 1], dtype=torch.int32),
          "late start": torch.tensor([3, 10, 40, s * world], dtype=torch.int32),
          "one rank differs": good if rank == 0 else torch.tensor([0, 11, 40, s * world],
                                                                   dtype=torch.int32)}[case]
    try:
        mb.burst_attn(q, k, v, causal=True, layout="pack_zigzag", cu_seqlens=cu)
        mb.burst_attn(q, k, v, causal=True, layout="pack_zigzag", cu_seqlens=good)
    except ValueError as err:
        return str(err)
    return "no error"


@pytest.mark.parametrize("case", ["decreasing", "short", "late start", "one rank differs"])
def test_bad_or_differing_boundaries_raise_the_same_error_on_every_rank(case):
    said = run_ranks(2, _bad_boundaries, case, timeout=120)
    assert said[0] == said[1], said
    expected = "different cu_seqlens" if case == "one rank differs" else "must start at 0"
    assert expected in said[0] and "pack_zigzag" in said[0], said[0]


def test_what_pack_zigzag_cannot_take_raises():
    q, k, v = (torch.randn(1, 32, 2, 8) for _ in range(3))
    cu = torch.tensor([0, 10, 32], dtype=torch.int32)
    with pytest.raises(ValueError, match="window_size cannot be combined"):
        mb.burst_attn(q, k, v, causal=True, layout="pack_zigzag", cu_seqlens=cu,
                      window_size=(4, 0))
    with pytest.raises(ValueError, match="keep= cannot be combined"):
        mb.burst_attn(q, k, v, causal=True, layout="pack_zigzag", cu_seqlens=cu,
                      keep=mb.AttentionKeep() if hasattr(mb, "AttentionKeep") else
                      __import__("megatron_burst.attention.remat", fromlist=["x"])
                      .AttentionKeep())
    with pytest.raises(ValueError, match="cu_seqlens needs batch size 1"):
        mb.burst_attn(*(torch.randn(2, 32, 2, 8) for _ in range(3)), causal=True,
                      layout="pack_zigzag", cu_seqlens=cu)
    with pytest.raises(ValueError, match="1-D int32/int64"):
        mb.burst_attn(q, k, v, causal=True, layout="pack_zigzag", cu_seqlens=cu.float())


def test_documents_on_and_across_chunk_edges_match_float64_reference():
    """Chunks of 16 rows on 2 ranks: documents that start on a chunk's first row, one that
    crosses three chunks, one-row documents at both ends, empty ones between."""
    packs = [(16, 16, 32), (8, 40, 16), (1, 62, 1), (16, 0, 0, 48), (64,), (15, 2, 47)]
    cases = [dict(layout="pack_zigzag", causal=causal, backward=backward, hq=2, hkv=1, d=8,
                  dtype=torch.float32, doc_lens=lens)
             for lens in packs for causal in (True, False) for backward in ("ring", "burst")]
    check_grid(2, cases)


def _other_counts(rank: int, world: int) -> str:
    q, k, v = (torch.randn(1, 32, 2, 8) for _ in range(3))
    cu = torch.tensor([0, 10, 40, 64] + [64] * rank, dtype=torch.int32)  # padded differently
    try:
        mb.burst_attn(q, k, v, causal=True, layout="pack_zigzag", cu_seqlens=cu)
    except ValueError as err:
        return str(err)
    return "no error"


def test_ranks_that_pad_to_other_counts_get_the_same_error():
    """The count is what a call is keyed and agreed by: ranks whose boundaries have other
    lengths are told apart before any message moves, with one error on every rank."""
    said = run_ranks(2, _other_counts, timeout=120)
    assert said[0] == said[1] and "ranks disagree on 'cu_seqlens'" in said[0], said


@pytest.mark.parametrize("world", [2, 3, 4])
def test_a_rank_s_own_rows_are_one_call_whatever_its_chunks(world):
    """A zigzag rank holds two chunks apart; its own rows against its own keys are one call
    whose sequences are the documents as its rows hold them (``own_launch``), not a block per
    pair of chunks. The boundaries the call gets: each document's rows of the rank's shard."""
    from megatron_burst.kernels.device_calls import BoundarySides, pair_launches
    from megatron_burst.plan.placement import rank_segments

    total = 8 * world
    cu = torch.tensor([0, 3, 3 * world, 6 * world + 1, total], dtype=torch.int32)
    for rank in range(world):
        shard = rank_segments("pack_zigzag", world, rank, (total,))
        sides = BoundarySides(total)
        (launch,) = pair_launches(shard, shard, True, sides)
        assert launch.summed and launch.q_runs == launch.k_runs == ((0, 8),)
        (bound,) = sides.bind(cu)
        positions = [seg.pos + i for seg in shard for i in range(seg.length)]
        doc = torch.bucketize(torch.tensor(positions), cu[1:], right=True)
        want = [0] + [int((doc <= d).sum()) for d in range(len(cu) - 1)]
        assert bound.cu_q_device.tolist() == bound.cu_k_device.tolist()
        assert bound.cu_q_device.tolist()[1:-1] == want, (rank, want)
