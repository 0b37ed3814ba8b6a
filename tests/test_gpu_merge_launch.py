"""GPU check of the fused merge launched past Triton's binding (``kernels.triton_direct``;
skipped without CUDA and Triton): on this machine's Triton the merge's launches are adopted
(else the host saving is silently gone), and every adopted launch gives the bits Triton's
own launch gives, on views at any row offset, every accumulator and partial dtype, under a
CUDA graph too; a launch with a 64-bit stride is keyed to Triton's own launch."""
from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

PAIRS = [(torch.bfloat16, torch.bfloat16), (torch.float32, torch.bfloat16),
         (torch.float32, torch.float32), (torch.float16, torch.float16)]


def _partials(gen, acc, part, d, rows=300):
    out = torch.randn(1, rows + 40, 8, d, device="cuda", generator=gen).to(acc)
    lse = torch.randn(1, 8, rows + 40, device="cuda", generator=gen)
    blk = torch.randn(1, rows + 77, 8, d, device="cuda", generator=gen).to(part)
    blse = torch.randn(1, 8, rows + 77, device="cuda", generator=gen)
    lse[:, :, 40:45], blse[:, :, 80:90] = float("-inf"), float("-inf")
    # views at row offsets, as the ring's runs are
    return out[:, 40:], lse[:, :, 40:], blk[:, 77:], blse[:, :, 77:]


def _tritons_own(out, lse, blk, blse):
    """The same launch through Triton's binding."""
    from megatron_burst.kernels import merge

    with merge.tritons_own_launch():
        merge._launch(out, lse, blk, blse)


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("acc,part", PAIRS)
def test_the_direct_launch_is_adopted_and_gives_tritons_bits(acc, part, d):
    pytest.importorskip("triton")
    from megatron_burst.kernels import merge

    gen = torch.Generator(device="cuda").manual_seed(d)
    for _ in range(3):  # the first learns, the others launch directly
        out, lse, blk, blse = _partials(gen, acc, part, d)
        mine, theirs = (out.clone(), lse.clone()), (out.clone(), lse.clone())
        merge.merge_partial(*mine, blk, blse)
        _tritons_own(*theirs, blk, blse)
        assert torch.equal(mine[0], theirs[0]) and torch.equal(mine[1], theirs[1])
    ints = [1] * 17
    key = merge._direct_key(mine[0], mine[1], blk, blse, ints, merge.ROW_ALIGN,
                            max(16, 4096 // d), 4, False)
    assert key is not None and merge._LAUNCHES.adopted(key), key


def test_a_captured_merge_launches_directly_and_replays_tritons_bits():
    pytest.importorskip("triton")
    from megatron_burst.kernels import merge

    gen = torch.Generator(device="cuda").manual_seed(5)
    out, lse, blk, blse = _partials(gen, torch.bfloat16, torch.bfloat16, 128)
    merge.merge_partial(out.clone(), lse.clone(), blk, blse)  # adopted before the capture
    start = (out.clone(), lse.clone())
    mine = (out.clone(), lse.clone())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        merge.merge_partial(*mine, blk, blse)
    mine[0].copy_(start[0])
    mine[1].copy_(start[1])
    graph.replay()
    theirs = (start[0].clone(), start[1].clone())
    _tritons_own(*theirs, blk, blse)
    torch.cuda.synchronize()
    assert torch.equal(mine[0], theirs[0]) and torch.equal(mine[1], theirs[1])


def test_a_64_bit_stride_goes_through_tritons_binding():
    pytest.importorskip("triton")
    from megatron_burst.kernels import merge

    base = torch.zeros(64, 8, 128, device="cuda", dtype=torch.bfloat16)
    out = base.as_strided((1, 64, 8, 128), (16 * (2 ** 31 + 64), 1024, 128, 1))  # one batch
    lse = torch.zeros(1, 8, 64, device="cuda")
    ints = (64, 8, 2 ** 31 + 64, 64, 8)  # Triton would pass it as a 64-bit integer
    assert merge._direct_key(out, lse, base[None], lse, ints, 16, 32, 4, False) is None
