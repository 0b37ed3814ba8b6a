"""The Megatron layer's own checks end on every rank of the CP group, never on one alone.

A check that reads a call's data (the dense attention mask a dataloader built, THD
boundaries) can fail on one rank only: before, that rank raised while its peers, whose
arguments had been verified before, went on into the ring and waited out the timeout.
And a rank that makes one attention call more than its peers is caught once per
micro-batch by comparing the ranks' call counts (``call_count``).
"""
from __future__ import annotations

import os
import time

import pytest
import torch

pytest.importorskip("megatron.core")

from tests.distributed import run_ranks  # noqa: E402
from tests.megatron import harness  # noqa: E402


def _layers_and_inputs(count: int = 1):
    """``count`` layers (numbers 1..count) on one CP=2 group, and this rank's inputs."""
    from megatron.core import parallel_state
    from megatron.core.transformer.enums import AttnMaskType

    from megatron_burst.megatron.attention import BurstDotProductAttention
    from tests.megatron import cpu_llama as cm

    cm.init_parallel(cp=2)
    rank = parallel_state.get_context_parallel_rank()
    config = cm.tiny_llama_config(harness.SHAPE)
    layers = [BurstDotProductAttention(config, n, AttnMaskType.causal)
              for n in range(1, count + 1)]
    gen = torch.Generator().manual_seed(rank)
    qkv = [torch.randn(8, 1, heads, 16, generator=gen) for heads in (4, 2, 2)]
    rows = torch.cat([torch.arange(4 * rank, 4 * rank + 4),
                      torch.arange(4 * (3 - rank), 4 * (3 - rank) + 4)])  # zigzag, s = 16
    causal = (torch.arange(16)[None, :] > rows[:, None])[None, None]  # True = masked out
    return layers, qkv, causal, rank


def _timed(fn) -> str:
    start = time.monotonic()
    try:
        fn()
        return "no error"
    except ValueError as e:
        return f"ValueError after {time.monotonic() - start:.1f}s: {e}"
    except RuntimeError as e:
        return f"RuntimeError after {time.monotonic() - start:.1f}s: {e}"


def _mask_worker(rank: int, world: int) -> str:
    os.environ["MEGATRON_BURST_TIMEOUT_S"] = "30"
    (layer,), qkv, causal, rank = _layers_and_inputs()
    layer(*qkv, causal)  # verified: the next call's arguments skip the check
    mask = causal.clone()
    if rank == 0:  # an EOD inside rank 0's last zigzag chunk: a document mask there only
        mask[..., 6:, :13] = True
        mask[..., 6:, 12] = False
    return _timed(lambda: layer(*qkv, mask))


def test_a_mask_refused_on_one_rank_fails_every_rank_at_once() -> None:
    outcomes = run_ranks(2, _mask_worker, timeout=180)
    for outcome in outcomes:
        assert outcome.startswith("ValueError"), outcome
        assert "failed on rank 0" in outcome and "not the plain causal mask" in outcome
        assert float(outcome.split("after ")[1].split("s")[0]) < 10, outcome  # no timeout
    assert len({o.split(": ", 1)[1] for o in outcomes}) == 1


def _count_worker(rank: int, world: int) -> dict:
    from megatron_burst.megatron.documents import document_params

    os.environ["MEGATRON_BURST_TIMEOUT_S"] = "30"
    (first, second), qkv, _, rank = _layers_and_inputs(2)
    # Four documents of 4 tokens: each stays whole on one rank, so no message moves and the
    # headers, which ride on messages, cannot see a call made on one rank only.
    docs = document_params(torch.tensor([0, 4, 8, 12, 16], dtype=torch.int32))
    first.positions_follow_documents = second.positions_follow_documents = True
    run = lambda layer: layer(*qkv, None, packed_seq_params=docs)  # noqa: E731
    for _ in range(3):  # micro-batches: layer 1 then layer 2, the same on both ranks
        run(first)
        run(second)
    results = {}
    for name, layer in (("with check", first), ("without", second)):  # what the check costs
        start = time.perf_counter()
        for _ in range(50):
            run(layer)
        results[name] = (time.perf_counter() - start) / 50 * 1e3
    if rank == 1:
        run(second)  # one call too many, with layer 2's own arguments and label
    results["next micro-batch"] = _timed(lambda: run(first))
    return results


def test_a_rank_with_one_call_too_many_is_caught_at_the_next_micro_batch() -> None:
    for res in run_ranks(2, _count_worker, timeout=180):
        outcome = res["next micro-batch"]
        assert outcome.startswith("ValueError"), outcome
        assert "made different numbers of attention calls" in outcome, outcome
        print(f"per-micro-batch call-count check on 2 gloo ranks: "
              f"{res['with check'] - res['without']:+.3f} ms a micro-batch "
              f"({res['with check']:.3f} vs {res['without']:.3f} ms a call)")
